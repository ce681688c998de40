"""Retention: the pruner's election lock, and the batched deletes (with their dry-run counts) of
finished jobs, of the history and of old throughput minutes. Each never waits for a row lock.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Delete,
    Select,
    Text,
    bindparam,
    delete,
    func,
    literal_column,
    select,
)

from sqla_jobs.sql.tables import (
    ADVISORY_NAMESPACE,
    CANCELLED,
    COMPLETED,
    DEAD,
    ONE_MICROSECOND,
    history,
    job,
    throughput,
)

__all__ = [
    "PRUNE_LOCK_NAME",
    "count_prunable_history",
    "count_prunable_jobs",
    "prune_history",
    "prune_jobs",
    "prune_throughput",
    "try_lock_pruner",
    "unlock_pruner",
]


#: Second key of the pruner's election lock (with :data:`ADVISORY_NAMESPACE`), per schema.
PRUNE_LOCK_NAME = "sqla_jobs.prune"


def _expired(finished: ColumnElement[Any]) -> ColumnElement[bool]:
    # Finished more than ``older_than`` ago, by the database's clock. Bound as microseconds (not an
    # interval: '1 day' would be a calendar day in the session's time zone).
    return finished < func.now() - bindparam("older_than_us", type_=BigInteger) * ONE_MICROSECOND


def _prunable_jobs() -> tuple[ColumnElement[bool], ...]:
    # The IN list is the finished index's own predicate, as literals, so that a generic plan can
    # use the partial index; ``state`` (bound) then picks one outcome from it.
    return (
        job.c.state.in_([COMPLETED, DEAD, CANCELLED]),
        job.c.state == bindparam("state", type_=Text),
        _expired(job.c.finished_at),
    )


def prune_jobs() -> Delete:
    """Delete up to ``limit`` jobs in terminal state ``state`` (``completed``, ``dead`` or
    ``cancelled``) that finished more than ``older_than_us`` microseconds ago, oldest first,
    except the ids in ``skip``. The number deleted is the cursor's row count.

    Never waits: the selection locks its rows ``FOR UPDATE SKIP LOCKED``, so a row an operator or
    a worker holds is stepped over (and deleted by a later run), and nobody waits on the prune
    except for the rows it is deleting, which no claim, heartbeat or reap reads (they are in no
    claim or running index). Pending and running jobs cannot match: their state is not terminal
    (re-checked on the latest row version when it is locked). A short transaction of its own:
    run it in autocommit, batch after batch. Served by ``sqla_jobs_job_finished_idx`` (partial,
    terminal rows only: ``state``, ``finished_at``), an ordered range scan; the rows are then
    deleted by primary key.
    """
    picked = (
        select(job.c.id)
        .where(
            *_prunable_jobs(),
            job.c.id != func.all(bindparam("skip", type_=ARRAY(BigInteger))),
        )
        .order_by(job.c.finished_at)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update(skip_locked=True)
    )
    return delete(job).where(
        job.c.id == func.any(func.array(picked.scalar_subquery())),
        job.c.state.in_([COMPLETED, DEAD, CANCELLED]),
    )


def count_prunable_jobs() -> Select[Any]:
    """How many jobs :func:`prune_jobs` would delete with the same ``state`` and
    ``older_than_us`` (``--dry-run``). A plain read, no locks; served by
    ``sqla_jobs_job_finished_idx`` (an index-only scan once the table is vacuumed)."""
    return select(func.count()).select_from(job).where(*_prunable_jobs())


def _prunable_history() -> tuple[ColumnElement[bool], ...]:
    return (
        history.c.outcome == bindparam("outcome", type_=Text),
        _expired(history.c.finished_at),
    )


def prune_history() -> Delete:
    """Delete up to ``limit`` rows of ``sqla_jobs_history`` with outcome ``outcome`` that finished
    more than ``older_than_us`` microseconds ago, oldest first. The number deleted is the
    cursor's row count.

    Locks only the rows it deletes (``FOR UPDATE SKIP LOCKED``: never waits for a row someone else
    holds). A completion that writes history only inserts new rows, so it never waits on a prune
    and a prune never waits on it. A short transaction of its own: run it in autocommit. Served by
    ``sqla_jobs_history_finished_idx`` (``finished_at``; ``outcome`` is a filter on it, all
    ``completed`` today), then the primary key.
    """
    picked = (
        select(history.c.id)
        .where(*_prunable_history())
        .order_by(history.c.finished_at)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update(skip_locked=True)
    )
    return delete(history).where(history.c.id == func.any(func.array(picked.scalar_subquery())))


def count_prunable_history() -> Select[Any]:
    """How many rows :func:`prune_history` would delete with the same ``outcome`` and
    ``older_than_us`` (``--dry-run``). A plain read, no locks; served by
    ``sqla_jobs_history_finished_idx``."""
    return select(func.count()).select_from(history).where(*_prunable_history())


def try_lock_pruner() -> Select[tuple[bool]]:
    """Try to become the one pruner of the queue table in ``schema_name``: a *session-level*
    advisory lock (:data:`ADVISORY_NAMESPACE`, ``hashtext('sqla_jobs.prune:' || schema_name)``),
    never waited for; true if this session holds it now. Holding it opens no transaction, so it
    pins no snapshot; :func:`unlock_pruner` releases it, and so does the session's end."""
    return select(func.pg_try_advisory_lock(*_pruner_key()))


def unlock_pruner() -> Select[tuple[bool]]:
    """Release the lock :func:`try_lock_pruner` took (true if this session held it)."""
    return select(func.pg_advisory_unlock(*_pruner_key()))


def _pruner_key() -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    schema = func.coalesce(bindparam("schema_name", type_=Text), literal_column("''"))
    name: ColumnElement[str] = literal_column(f"'{PRUNE_LOCK_NAME}:'") + schema
    return literal_column(str(ADVISORY_NAMESPACE)), func.hashtext(name)


def prune_throughput() -> Delete:
    """Delete the throughput rows of minutes that began more than ``older_than_us``
    microseconds ago. A range of the primary key; no worker writes these old minutes any more,
    so nothing waits on it."""
    return delete(throughput).where(
        throughput.c.minute
        < func.now() - bindparam("older_than_us", type_=BigInteger) * ONE_MICROSECOND
    )
