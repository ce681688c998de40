"""What an operator does to jobs and queues (:mod:`sqla_jobs.operations`): lock or find the jobs,
then retry, cancel, request a cancel, delete (a queue's pause: :mod:`~sqla_jobs.sql.queues`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Select,
    Text,
    bindparam,
    delete,
    func,
    literal_column,
    null,
    or_,
    select,
    update,
)

from sqla_jobs.sql.tables import (
    CANCELLED,
    DEAD,
    PENDING,
    RUNNING,
    ids_param,
    job,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyDelete, AnyUpdate


__all__ = [
    "cancel_pending",
    "count_jobs",
    "delete_jobs",
    "find_jobs",
    "find_jobs_among",
    "lock_jobs",
    "peek_jobs",
    "request_cancel",
    "retry_jobs",
]


#: What an operation reads of the jobs it locks: id, state, queue, whether a cancel was requested
#: and whether the job is unique (a retry checks its key).
_OPERATED_COLUMNS = (
    job.c.id,
    job.c.state,
    job.c.queue,
    job.c.cancel_requested_at.is_not(None),
    job.c.unique_key.is_not(None),
)


def lock_jobs() -> Select[Any]:
    """The jobs ``ids`` that exist, with state, queue, whether a cancel was requested and whether
    the job is unique, locked
    (``FOR UPDATE``) so that an operation sees and changes them as one: a worker's completion of
    one of them waits for the operator's transaction, and the other way round. Primary key."""
    return (
        select(*_OPERATED_COLUMNS)
        .where(job.c.id == func.any(ids_param()))
        .order_by(job.c.id)
        .with_for_update()
    )


def _matching() -> tuple[ColumnElement[bool], ...]:
    """The filter of an operation by filter, the one source for what it touches and for what
    its count says: ``state`` one of ``states`` (a text array), of ``queue`` and ``kind`` when
    given, and ``id <= max_id`` when given (NULL: any), so a count an operator confirmed bounds
    the run that follows it."""
    kind = bindparam("kind", type_=Text)
    queue = bindparam("queue", type_=Text)
    max_id = bindparam("max_id", type_=BigInteger)
    return (
        job.c.state == func.any(bindparam("states", type_=ARRAY(Text))),
        or_(queue.is_(None), job.c.queue == queue),
        or_(kind.is_(None), job.c.kind == kind),
        or_(max_id.is_(None), job.c.id <= max_id),
    )


def find_jobs() -> Select[Any]:
    """Up to ``limit`` jobs matching the filter (``states``, ``queue``, ``kind``, ``max_id``),
    oldest id first, locked as :func:`lock_jobs` locks them. For an operation by filter
    (``retry --all-dead``, ``cancel --queue``). Served by the claim, running and finished
    indexes' leading columns or a scan: operations are rare."""
    return (
        select(*_OPERATED_COLUMNS)
        .where(*_matching())
        .order_by(job.c.id)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update()
    )


def peek_jobs() -> Select[Any]:
    """The id and state of the first ``limit`` jobs :func:`find_jobs` would lock, oldest id
    first, without locking them: what an operation by filter would touch, shown before it runs
    (``--dry-run``, the confirmation)."""
    return (
        select(job.c.id, job.c.state)
        .where(*_matching())
        .order_by(job.c.id)
        .limit(bindparam("limit", type_=BigInteger))
    )


def count_jobs() -> Select[Any]:
    """How many jobs match the filter of :func:`find_jobs`, by state, uncapped (the run itself is
    capped; the count says how far beyond the cap the backlog goes). Locks nothing."""
    return (
        select(job.c.state, func.count().label("jobs"))
        .where(*_matching())
        .group_by(job.c.state)
        .order_by(job.c.state)
    )


def find_jobs_among() -> Select[Any]:
    """:func:`find_jobs` among the jobs ``ids`` (a bigint array: what the application's own query
    of job ids returned, for an operation given a SELECT), locked as :func:`lock_jobs` locks them.
    An id no job has is no error: a filter finds what is there. Primary key."""
    return find_jobs().where(job.c.id == func.any(ids_param()))


def retry_jobs() -> AnyUpdate:
    """Run the dead, cancelled or pending jobs ``ids`` as soon as possible: ``pending`` at
    ``now()`` with both budgets whole again (``attempts``, ``crashes`` and ``interruptions`` at
    0), the cancel request and ``finished_at`` cleared; ``errors`` and ``last_error`` are kept, for
    the record. Running and completed jobs are left alone. Returns the ids and their queues."""
    return (
        update(job)
        .where(
            job.c.id == func.any(ids_param()),
            job.c.state.in_([PENDING, DEAD, CANCELLED]),
        )
        .values(
            state=PENDING,
            run_at=func.now(),
            attempts=0,
            crashes=0,
            interruptions=0,
            cancel_requested_at=null(),
            finished_at=null(),
        )
        .returning(job.c.id, job.c.queue)
    )


def cancel_pending() -> AnyUpdate:
    """Cancel the pending or waiting jobs ``ids``: ``cancelled``, never to run (their dependents
    are cancelled by the trigger of :mod:`sqla_jobs.model.workflows`). Returns their ids."""
    return (
        update(job)
        .where(
            job.c.id == func.any(ids_param()),
            job.c.state.in_([PENDING, literal_column("'waiting'")]),
        )
        .values(state=CANCELLED, finished_at=func.now())
        .returning(job.c.id)
    )


def delete_jobs() -> AnyDelete:
    """Delete the jobs ``ids`` that are in one of ``states`` (finished ones: the caller checked and
    locked them). Returns their ids. Primary-key probes; an application's foreign key to a job
    raises here, as for any delete."""
    return (
        delete(job)
        .where(
            job.c.id == func.any(ids_param()),
            job.c.state == func.any(bindparam("states", type_=ARRAY(Text))),
        )
        .returning(job.c.id)
    )


def request_cancel() -> AnyUpdate:
    """Ask the worker running each of the jobs ``ids`` to cancel it (stored, so that a worker that
    dies meanwhile cannot put it back in the queue: the reaper makes it ``cancelled``). Running
    jobs only; the first request's time is kept. Returns their ids."""
    return (
        update(job)
        .where(job.c.id == func.any(ids_param()), job.c.state == RUNNING)
        .values(cancel_requested_at=func.coalesce(job.c.cancel_requested_at, func.now()))
        .returning(job.c.id)
    )
