"""The names every object of the package starts with, the package's own ``MetaData``, the job
states, and the LISTEN/NOTIFY channels."""

from __future__ import annotations

import enum

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

PREFIX = "sqla_jobs"
JOB_TABLE = f"{PREFIX}_job"
HISTORY_TABLE = f"{PREFIX}_history"
QUEUE_TABLE = f"{PREFIX}_queue"
SCHEDULE_TABLE = f"{PREFIX}_schedule"
WORKER_TABLE = f"{PREFIX}_worker"
THROUGHPUT_TABLE = f"{PREFIX}_throughput"
DEPENDENCY_TABLE = f"{PREFIX}_dependency"
OUTCOME_TABLE = f"{PREFIX}_outcome"
RATE_LIMITER_TABLE = f"{PREFIX}_rate_limiter"
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
    #: Enqueued with ``depends_on`` and some parent not finished yet: never claimed (it is outside
    #: the claim's partial indexes); the last parent's completion makes it ``pending``.
    WAITING = "waiting"


STATES = tuple(s.value for s in JobState)
#: Where enqueue notes, in a returned ``Job``'s ``__dict__``, what it did: "inserted",
#: "duplicate" or "replaced" (read by :attr:`Job.inserted` and :attr:`Job.replaced`).
ENQUEUED = "_sqla_jobs_enqueued"
#: The unique index's predicate, which an ``INSERT ... ON CONFLICT`` must repeat to use it.
UNIQUE_PREDICATE = "unique_key IS NOT NULL AND state = ANY (unique_states)"
#: The states a worker moves a job between on its own (claim, fail, reap, release, snooze): a
#: unique job's key always counts in them, so that none of those moves can hit the unique index.
ALWAYS_UNIQUE_STATES = (JobState.PENDING.value, JobState.RUNNING.value)
#: The states in which every unique job enqueued from now on holds its key: a waiting job's
#: release to pending must not hit the unique index. (The CHECK keeps requiring only
#: :data:`ALWAYS_UNIQUE_STATES`: rows written before ``waiting`` existed never wait.)
HELD_UNIQUE_STATES = (*ALWAYS_UNIQUE_STATES, JobState.WAITING.value)


class Base(DeclarativeBase):
    """Declarative base on the package's own MetaData (never the application's)."""

    metadata = metadata


def notify_channel(schema: str | None) -> str:
    """The LISTEN/NOTIFY channel of the queue table in ``schema``."""
    return PREFIX if schema is None else f"{PREFIX}.{schema}"


def cancel_channel(schema: str | None) -> str:
    """The channel that tells workers which running jobs an operator cancelled (job ids)."""
    return f"{notify_channel(schema)}.cancel"
