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
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PREFIX = "sqla_jobs"
JOB_TABLE = f"{PREFIX}_job"
HISTORY_TABLE = f"{PREFIX}_history"
QUEUE_TABLE = f"{PREFIX}_queue"
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
