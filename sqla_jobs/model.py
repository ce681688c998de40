"""The ``Job`` mapped class and the package's own ``MetaData``.

Every object the package creates starts with ``sqla_jobs``, so one grep finds them all and nothing
collides with the application's tables. The tables carry no schema: the schema is chosen at run time
(``Jobs(schema=...)``, through SQLAlchemy's ``schema_translate_map``) and in migrations
(``-x sqla_jobs_schema=...``), so the default is the connection's ``search_path``.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    DDL,
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Text,
    event,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PREFIX = "sqla_jobs"
JOB_TABLE = f"{PREFIX}_job"
HISTORY_TABLE = f"{PREFIX}_history"
QUEUE_TABLE = f"{PREFIX}_queue"
SCHEDULE_TABLE = f"{PREFIX}_schedule"
WORKER_TABLE = f"{PREFIX}_worker"
THROUGHPUT_TABLE = f"{PREFIX}_throughput"
#: Alembic's version table of sqla-jobs' own environment (sqla-jobs migrate): not in ``metadata``.
VERSION_TABLE = f"{PREFIX}_alembic_version"
#: Longest ``last_error`` kept; a stack-trace storm must not bloat the hot table.
MAX_ERROR_CHARS = 500

metadata = MetaData(
    naming_convention={
        "ix": "%(table_name)s_%(column_0_N_name)s_idx",
        "uq": "%(table_name)s_%(column_0_N_name)s_key",
        "ck": "%(table_name)s_%(constraint_name)s_check",
        "fk": "%(table_name)s_%(column_0_N_name)s_fkey",
        "pk": "%(table_name)s_pkey",
    }
)


class JobState(str, enum.Enum):
    """Where a job is in its life. A job whose handler succeeded is deleted (or moved to history),
    so ``completed`` rows are the exception: see :attr:`COMPLETED`."""

    #: Waiting for ``run_at``; claimable once it has passed.
    PENDING = "pending"
    #: Claimed by a worker that holds its lease.
    RUNNING = "running"
    #: Gave up: failure or crash budget spent, or a payload that can never validate.
    DEAD = "dead"
    #: The handler succeeded but the row could not be deleted (a foreign key of the application's
    #: points at it): kept, terminal, never claimed again. ``last_error`` says why it was kept.
    COMPLETED = "completed"
    #: Cancelled by an operator (``Jobs.cancel``): never runs (again), never retried on its own.
    CANCELLED = "cancelled"


STATES = tuple(s.value for s in JobState)
#: Where enqueue notes, in a returned ``Job``'s ``__dict__``, what it did: "inserted",
#: "duplicate" or "replaced" (read by :attr:`Job.inserted` and :attr:`Job.replaced`).
ENQUEUED = "_sqla_jobs_enqueued"
#: The unique index's predicate, which an ``INSERT ... ON CONFLICT`` must repeat to use it.
UNIQUE_PREDICATE = "unique_key IS NOT NULL AND state = ANY (unique_states)"
#: The states a worker moves a job between on its own (claim, fail, reap, release, snooze): a
#: unique job's key always counts in them, so that none of those moves can hit the unique index.
ALWAYS_UNIQUE_STATES = (JobState.PENDING.value, JobState.RUNNING.value)


class Base(DeclarativeBase):
    """Declarative base on the package's own MetaData (never the application's)."""

    metadata = metadata


class Job(Base):
    """One row of the queue table: a job waiting, running, or dead.

    ``attempts`` counts claims (incremented when a worker claims the job, so a job that kills its
    worker cannot be retried forever); ``crashes`` counts the claims that ended with an expired lease
    rather than a handler result. Handler failures are therefore ``attempts - crashes`` once the job is
    back in ``pending``. ``max_attempts`` bounds handler failures, ``max_crashes`` bounds crashes.
    """

    __tablename__ = JOB_TABLE

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    queue: Mapped[str] = mapped_column(Text, server_default=text("'default'"))
    kind: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(Text, server_default=text("'pending'"))
    #: Lower runs first.
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("10"))
    crashes: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_crashes: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    #: A fresh random token per claim: every write a worker makes to the job is fenced on it.
    lease_token: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    locked_by: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    #: Jobs sharing a key run at most ``concurrency_limit`` at once, across all workers.
    concurrency_key: Mapped[str | None] = mapped_column(Text)
    concurrency_limit: Mapped[int | None] = mapped_column(Integer)
    #: Results of completed durable steps (``ctx.step``), by step name.
    steps: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    #: Runs stopped at a worker's shutdown and given back (neither a failure nor a crash).
    interruptions: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    #: When an operator asked to cancel the job while it ran (``Jobs.cancel``): the worker that
    #: holds it is told, and no retry, reap or give-back puts it back in the queue.
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: When the job reached a terminal state (dead, cancelled, completed-but-kept): retention
    #: counts from here.
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Tags and context: set at enqueue (``meta=``) or by an enqueue hook; never read by a claim.
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    #: One entry per failed attempt or crash, oldest first, the last 25 kept: attempt, at,
    #: error (class), message, traceback (capped).
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    #: A unique job's key (its kind, the payload fields or key it is unique by, and its period):
    #: no two jobs with one key are both in one of their ``unique_states``. NULL: not unique.
    unique_key: Mapped[str | None] = mapped_column(Text)
    #: The states in which a unique job holds its key; always includes pending and running.
    unique_states: Mapped[list[str] | None] = mapped_column(ARRAY(Text))

    @property
    def inserted(self) -> bool | None:
        """For a job returned by ``enqueue``: True if that call inserted it, False if it found
        this job already holding the unique key (and returned it instead). None otherwise."""
        result = self.__dict__.get(ENQUEUED)
        return None if result is None else result == "inserted"

    @property
    def replaced(self) -> bool:
        """For a job returned by ``enqueue(..., on_conflict="replace")``: whether that call
        replaced this pending job's payload, run_at, priority and meta."""
        return bool(self.__dict__.get(ENQUEUED) == "replaced")

    def __repr__(self) -> str:
        """``<Job 42 send_invoice pending queue=mail attempt 0/10 run_at=2026-12-01T07:06:23+00:00>``:
        never the payload (it may hold personal data, and reprs end up in logs and tracebacks).
        Reads only what is loaded (``?`` for the rest): a repr never runs SQL, and works on a
        detached or expired job."""
        d = self.__dict__
        run_at = d.get("run_at")
        when = run_at.isoformat(timespec="seconds") if isinstance(run_at, datetime) else "?"
        return (
            f"<Job {d.get('id', '?')} {d.get('kind', '?')} {d.get('state', '?')}"
            f" queue={d.get('queue', '?')} attempt {d.get('attempts', '?')}/"
            f"{d.get('max_attempts', '?')} run_at={when}>"
        )

    __table_args__ = (
        CheckConstraint(f"state IN ({', '.join(repr(s) for s in STATES)})", name="state"),
        # A running job always has a lease and nothing else does: the reaper and the fence rely on it.
        CheckConstraint(
            "(state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name="lease",
        ),
        CheckConstraint("attempts >= 0 AND crashes >= 0 AND interruptions >= 0", name="counters"),
        CheckConstraint("max_attempts >= 1 AND max_crashes >= 1", name="budgets"),
        CheckConstraint(f"char_length(last_error) <= {MAX_ERROR_CHARS}", name="last_error"),
        CheckConstraint("char_length(queue) BETWEEN 1 AND 128", name="queue"),
        CheckConstraint(
            "(concurrency_key IS NULL) = (concurrency_limit IS NULL) AND concurrency_limit >= 1",
            name="concurrency",
        ),
        CheckConstraint(
            "(unique_key IS NULL) = (unique_states IS NULL)"
            f" AND unique_states @> ARRAY[{', '.join(repr(s) for s in ALWAYS_UNIQUE_STATES)}]",
            name="unique",
        ),
        # Serves the claim. Partial: it holds only claimable rows without a concurrency key, so its
        # size tracks the backlog, not history, and a job leaves it the moment it is claimed.
        Index(
            f"{JOB_TABLE}_claim_idx",
            "queue",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("state = 'pending' AND concurrency_key IS NULL"),
        ),
        # Serves the keyed claim: pending keyed jobs of a queue, in per-key order.
        Index(
            f"{JOB_TABLE}_keyed_idx",
            "queue",
            "concurrency_key",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("state = 'pending' AND concurrency_key IS NOT NULL"),
        ),
        # Serves the reaper and the running count per key: only running rows, a handful at any
        # time. It deliberately does not cover lease_expires_at or steps, so a heartbeat or a step
        # record (which change nothing else) can be a HOT update.
        Index(
            f"{JOB_TABLE}_running_idx",
            "concurrency_key",
            postgresql_where=text("state = 'running'"),
        ),
        # Serves retention and the operator's listings of finished jobs: terminal rows only.
        Index(
            f"{JOB_TABLE}_finished_idx",
            "state",
            "finished_at",
            postgresql_where=text("state IN ('completed', 'dead', 'cancelled')"),
        ),
        # Holds unique jobs' keys, exact across transactions: one job per key among the jobs in
        # a state that counts for it. Jobs without a key are not in it (nothing to maintain).
        Index(
            f"{JOB_TABLE}_unique_idx",
            "unique_key",
            unique=True,
            postgresql_where=text(UNIQUE_PREDICATE),
        ),
    )


class JobHistory(Base):
    """A finished job, kept only when ``Worker(keep_history=True)``; never read by the hot path."""

    __tablename__ = HISTORY_TABLE

    #: The finished job's id (no sequence of its own).
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    queue: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    attempts: Mapped[int] = mapped_column(Integer)
    crashes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    #: How the job ended; only ``completed`` today (dead and cancelled jobs stay in the job table
    #: until retention removes them).
    outcome: Mapped[str] = mapped_column(Text, server_default=text("'completed'"))
    last_error: Mapped[str | None] = mapped_column(Text)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    steps: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONB)

    __table_args__ = (
        # Serves retention: the oldest rows first, in bounded batches.
        Index(f"{HISTORY_TABLE}_finished_idx", "finished_at"),
    )


class QueueState(Base):
    """What an operator set on a queue: paused or not. A queue without a row is active; the
    claim reads this table, so a pause holds for every worker, including ones started later."""

    __tablename__ = QUEUE_TABLE

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    #: Set while the queue is paused: no worker claims from it (enqueue still works).
    paused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Schedule(Base):
    """One periodic schedule's state, shared by every process that runs the scheduler: the last
    tick enqueued, advanced by compare-and-set in the transaction that enqueues the tick's job,
    so that each tick is enqueued once however many schedulers run. Written by the schedulers;
    the definition itself (cron or interval, kind, payload) lives in the application's code."""

    __tablename__ = SCHEDULE_TABLE

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    #: The schedule as defined when its last tick was enqueued (``cron */5 * * * * UTC``,
    #: ``every 30s``): a changed definition starts over from the next tick, never backfills.
    spec: Mapped[str] = mapped_column(Text)
    #: The last tick enqueued (the compare-and-set column); NULL until the first.
    last_tick_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: The job enqueued for ``last_tick_at``.
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)
    #: The tick after ``last_tick_at``, as the scheduler that wrote it computed it (for listings).
    next_tick_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Set while an operator holds the schedule: no tick is enqueued, and the ticks passed meanwhile
    #: are skipped.
    paused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: When a scheduler last found this schedule in its code: a schedule removed from the code is
    #: seen no more, and enqueues nothing.
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RegisteredWorker(Base):
    """A live worker process, as it registered itself: written when it starts, its heartbeat moved
    forward by its reaper thread, deleted when it stops gracefully; a row whose ``expires_at`` has
    passed (its process was killed, or lost the database for that long) is deleted by any other
    worker's reaper. For listings only (``sqla-jobs workers``): no claim reads it."""

    __tablename__ = WORKER_TABLE

    #: The worker's name (``host:pid:random`` unless named): also in its connections'
    #: ``application_name`` and in ``locked_by`` of the jobs it holds.
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    concurrency: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    #: The last heartbeat plus three of the worker's own heartbeat intervals, by the database's
    #: clock: past it, the row is stale and pruned.
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ThroughputMinute(Base):
    """What the workers finished in one minute, per queue and kind: counts by outcome, and the sums
    of run times and pickup delays (start minus ``run_at``) to average them by. Written by each
    worker at its reaper's beat as one upsert adding its counts to the minute's row, by the
    database's clock; pruned after :attr:`~sqla_jobs.Retention.throughput`. Completed jobs are
    deleted, so this is where a dashboard's throughput and latency over time come from
    (:func:`sqla_jobs.throughput.recent`). No claim reads it."""

    __tablename__ = THROUGHPUT_TABLE

    #: The start of the minute, by the database's clock when the worker wrote its counts.
    minute: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text, primary_key=True)
    completed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    #: Failed runs that will be retried (a run that used its last attempt counts as ``dead``).
    failed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    dead: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cancelled: Mapped[int] = mapped_column(BigInteger, server_default="0")
    snoozed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    #: Jobs the workers' reapers rescued from a worker that stopped heartbeating.
    crashed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    #: Handler runs timed, and their total duration in seconds.
    runs: Mapped[int] = mapped_column(BigInteger, server_default="0")
    run_seconds: Mapped[float] = mapped_column(Double, server_default="0")
    #: Jobs started, and their total wait from ``run_at`` to their start in seconds.
    pickups: Mapped[int] = mapped_column(BigInteger, server_default="0")
    pickup_seconds: Mapped[float] = mapped_column(Double, server_default="0")


#: Storage parameters of the queue table. The default autovacuum_vacuum_scale_factor (0.2) waits
#: until a fifth of the table is dead; on a hot queue table that is far too patient. fillfactor
#: leaves room on each page for the claim's new row versions (revision sqla_jobs_0002).
JOB_TABLE_STORAGE: dict[str, str] = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "200",
    "autovacuum_vacuum_insert_scale_factor": "0.05",
    "autovacuum_analyze_scale_factor": "0.05",
    "autovacuum_vacuum_cost_limit": "2000",
    "autovacuum_vacuum_cost_delay": "1",
    # Last: the order the two revisions set them in (pg_class.reloptions keeps it).
    "fillfactor": "70",
}


# create_all() must build the same table the migration does. (SQLAlchemy 2.0 has no
# postgresql_with for tables, so the parameters are set right after CREATE TABLE.)
event.listen(
    Job.__table__,
    "after_create",
    DDL(  # type: ignore[no-untyped-call]
        "ALTER TABLE %(fullname)s SET ("
        + ", ".join(f"{k} = {v}" for k, v in JOB_TABLE_STORAGE.items())
        + ")"
    ),
)


def notify_channel(schema: str | None) -> str:
    """The LISTEN/NOTIFY channel of the queue table in ``schema``."""
    return PREFIX if schema is None else f"{PREFIX}.{schema}"


def cancel_channel(schema: str | None) -> str:
    """The channel that tells workers which running jobs an operator cancelled (job ids)."""
    return f"{notify_channel(schema)}.cancel"
