"""The queue table (``Job``), its storage parameters, and the history of finished jobs."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Text,
    event,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from sqla_jobs.model.names import (
    ALWAYS_UNIQUE_STATES,
    ENQUEUED,
    HISTORY_TABLE,
    JOB_TABLE,
    MAX_ERROR_CHARS,
    STATES,
    UNIQUE_PREDICATE,
    Base,
)


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
    #: A job enqueued with ``depends_on``: how many of its parents have not finished yet, exact
    #: under the row lock while it is ``waiting``. NULL: a job without parents.
    waiting_on: Mapped[int | None] = mapped_column(Integer)
    #: Set (at the commit of a child's enqueue) on a job that some other job depends on: only such
    #: a job's end does dependency work. NULL: nobody depends on it.
    has_dependents: Mapped[bool | None] = mapped_column(Boolean)
    #: The rate limiter the job's start counts against (its kind, and the key its ``RateLimit``'s
    #: ``by=`` made, after a space); NULL: the kind has no rate limit. Claimed only by the rate
    #: limited claim, never by the plain or keyed one.
    rate_key: Mapped[str | None] = mapped_column(Text)

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
        # Serves the claim. Partial: it holds only claimable rows without a concurrency key or a
        # rate limit, so its size tracks the backlog, not history, a job leaves it the moment it
        # is claimed, and due jobs held by a rate limit are never scanned past.
        Index(
            f"{JOB_TABLE}_claim_idx",
            "queue",
            "priority",
            "run_at",
            "id",
            postgresql_where=text(
                "state = 'pending' AND concurrency_key IS NULL AND rate_key IS NULL"
            ),
        ),
        # Serves the keyed claim: pending keyed jobs of a queue, in per-key order.
        Index(
            f"{JOB_TABLE}_keyed_idx",
            "queue",
            "concurrency_key",
            "priority",
            "run_at",
            "id",
            postgresql_where=text(
                "state = 'pending' AND concurrency_key IS NOT NULL AND rate_key IS NULL"
            ),
        ),
        # Serves the rate limited claim: pending rate limited jobs of a queue, in per-limiter
        # order (keyed or not: that claim keeps the concurrency limits too).
        Index(
            f"{JOB_TABLE}_rated_idx",
            "queue",
            "rate_key",
            "priority",
            "run_at",
            "id",
            postgresql_where=text("state = 'pending' AND rate_key IS NOT NULL"),
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
