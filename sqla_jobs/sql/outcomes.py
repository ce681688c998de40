"""How a claimed run ends, each fenced on the claim's lease token: completed (deleted, kept, or moved
to the history), failed, snoozed, released at shutdown, or cancelled by an operator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Text,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import UUID

from sqla_jobs.model import (
    MAX_ERROR_CHARS,
)
from sqla_jobs.sql.tables import (
    CANCELLED,
    COMPLETED,
    DEAD,
    ONE_MICROSECOND,
    ONE_SECOND,
    PENDING,
    append_error,
    fenced,
    given_back,
    held_pairs,
    history,
    ids_param,
    job,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyDelete, AnyInsert, AnyUpdate


__all__ = [
    "complete",
    "complete_into_history",
    "fail",
    "finish_cancelled",
    "keep_completed",
    "keep_completed_in_session",
    "release",
    "snooze",
]


def _claimed_by() -> ColumnElement[bool]:
    # The jobs ``ids`` of the one claim ``token``: exact pairs (every id with that token), and one
    # index scan for the whole array, which a join of (id, token) pairs is not (a descent per
    # pair: 6% of a drain's throughput).
    return and_(
        job.c.id == func.any(ids_param()),
        job.c.lease_token == bindparam("token", type_=UUID(as_uuid=True)),
    )


def complete() -> AnyDelete:
    """Delete the finished jobs ``ids`` of the claim ``token`` whose lease that claim still holds;
    returns the deleted ids. A batch of several claims' jobs sends one per claim.

    Fenced: a job whose lease expired and was re-claimed carries another token and is left alone.
    Locks the deleted rows; served by the primary key.
    """
    return delete(job).where(_claimed_by()).returning(job.c.id)


def keep_completed() -> AnyUpdate:
    """Mark job ``id`` (lease ``token``) ``completed`` instead of deleting it, with ``error`` (why
    it could not be deleted) in ``last_error``: for a succeeded job whose row the application's
    foreign keys hold. Terminal: no claim, reap or retry takes it. Returns the id (no row: the
    lease was lost). Touches no column a foreign key can reference; served by the primary key."""
    return _end_held_run(COMPLETED)


def keep_completed_in_session() -> AnyUpdate:
    """:func:`keep_completed` with job ``job_id`` for a Session's ``execute``: SQLAlchemy
    reserves the name ``id`` of an UPDATE's column for its own parameters."""
    return _end_held_run(COMPLETED, "job_id")


def _end_held_run(state: ColumnElement[str], id_param: str = "id") -> AnyUpdate:
    # Job ``id`` (lease ``token``) ends in the terminal ``state``, ``error`` in ``last_error``.
    return (
        update(job)
        .where(_one_held(id_param))
        .values(
            state=state,
            finished_at=func.now(),
            last_error=func.left(bindparam("error", type_=Text), MAX_ERROR_CHARS),
            lease_token=null(),
            lease_expires_at=null(),
            locked_by=null(),
        )
        .returning(job.c.id)
    )


def complete_into_history() -> AnyInsert:
    """Like :func:`complete`, and copy each deleted job into ``sqla_jobs_history`` in the same
    statement; returns the ids kept."""
    done = (
        delete(job)
        .where(_claimed_by())
        .returning(*[job.c[c] for c in _HISTORY_COLUMNS])
        .cte("done")
    )
    return (
        insert(history)
        .from_select(list(_HISTORY_COLUMNS), select(*[done.c[c] for c in _HISTORY_COLUMNS]))
        .returning(history.c.id)
    )


_HISTORY_COLUMNS = (
    "id",
    "queue",
    "kind",
    "payload",
    "attempts",
    "crashes",
    "created_at",
    "last_error",
    "errors",
    "steps",
    "meta",
)


def fail() -> AnyUpdate:
    """Record a handler failure of job ``id`` under lease ``token``: one statement for both outcomes.

    ``dead`` when ``force_dead`` is true (a payload that can never validate) or the failure budget is
    spent (``attempts - crashes >= max_attempts``); otherwise back to ``pending`` with ``run_at`` pushed
    out by the database: ``least(power(base, failures), cap)`` seconds, times ``1 + jitter * random()``.
    ``exp_cap`` bounds the exponent so ``power()`` cannot overflow. ``last_error`` is truncated to 500
    characters, and the attempt's entry (``error_class``, ``message``, ``traceback``) appended to
    ``errors``. A job whose cancel was requested is ``cancelled`` instead: never retried. Fenced on
    the lease token; returns state, run_at, attempts, crashes (no row: the lease was lost). Locks
    the row; served by the primary key.
    """
    failures = job.c.attempts - job.c.crashes
    is_dead = or_(bindparam("force_dead", type_=Boolean), failures >= job.c.max_attempts)
    cancelled = job.c.cancel_requested_at.is_not(None)
    delay_seconds = func.least(
        func.power(
            bindparam("base", type_=Float),
            func.least(failures, bindparam("exp_cap", type_=BigInteger)),
        ),
        bindparam("cap", type_=Float),
    ) * (1 + bindparam("jitter", type_=Float) * func.random())
    return (
        update(job)
        .where(job.c.id == bindparam("id", type_=BigInteger))
        .where(job.c.lease_token == bindparam("token", type_=UUID(as_uuid=True)))
        .values(
            state=case((cancelled, CANCELLED), (is_dead, DEAD), else_=PENDING),
            run_at=case(
                (or_(cancelled, is_dead), job.c.run_at),
                else_=func.now() + delay_seconds * ONE_SECOND,
            ),
            finished_at=case((or_(cancelled, is_dead), func.now()), else_=null()),
            last_error=func.left(bindparam("error", type_=Text), MAX_ERROR_CHARS),
            errors=append_error(
                bindparam("error_class", type_=Text),
                bindparam("message", type_=Text),
                bindparam("traceback", type_=Text),
            ),
            lease_token=null(),
            lease_expires_at=null(),
            locked_by=null(),
        )
        .returning(job.c.state, job.c.run_at, job.c.attempts, job.c.crashes)
    )


def release() -> AnyUpdate:
    """Give back jobs this worker claimed but will not finish (graceful shutdown).

    Back to ``pending`` at their old place in line, lease cleared, and the claim's attempt undone:
    a release is neither a failure nor a crash. With ``interrupted`` (the handlers had started)
    ``interruptions`` counts it, so the next run knows it is a re-run. A job whose cancel was
    requested is ``cancelled`` instead. Fenced on the (``ids``, ``tokens``) pairs; returns the
    released ids.
    """
    held = held_pairs()
    interrupted = bindparam("interrupted", False, type_=Boolean)
    return (
        update(job)
        .where(fenced(held))
        .values(**given_back(case((interrupted, 1), else_=0)))
        .returning(job.c.id)
    )


def _one_held(id_param: str = "id") -> ColumnElement[bool]:
    return and_(
        job.c.id == bindparam(id_param, type_=BigInteger),
        job.c.lease_token == bindparam("token", type_=UUID(as_uuid=True)),
    )


def snooze() -> AnyUpdate:
    """A handler snoozed job ``id`` (lease ``token``): back to ``pending`` at ``now()`` plus
    ``delay_us`` microseconds (the database clock), the claim's attempt undone: neither a failure
    nor a crash. A job whose cancel was requested is ``cancelled`` instead. Returns state and
    run_at (no row: the lease was lost). Served by the primary key."""
    cancelled = job.c.cancel_requested_at.is_not(None)
    return (
        update(job)
        .where(_one_held())
        .values(
            state=case((cancelled, CANCELLED), else_=PENDING),
            run_at=func.now() + bindparam("delay_us", type_=BigInteger) * ONE_MICROSECOND,
            finished_at=case((cancelled, func.now()), else_=null()),
            attempts=func.greatest(job.c.attempts - 1, 0),
            lease_token=null(),
            lease_expires_at=null(),
            locked_by=null(),
        )
        .returning(job.c.state, job.c.run_at)
    )


def finish_cancelled() -> AnyUpdate:
    """Job ``id`` (lease ``token``) ended because an operator cancelled it: ``cancelled``, its
    ``error`` (how the handler stopped) in ``last_error``; terminal, never retried on its own.
    Returns the id (no row: the lease was lost). Served by the primary key."""
    return _end_held_run(CANCELLED)
