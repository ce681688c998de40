"""What an operator sets on a queue (``sqla_jobs_queue``): pause, resume, read and forget its row;
and which queues the database knows of, for refusing to pause a name nothing uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Select,
    Text,
    bindparam,
    delete,
    func,
    literal_column,
    null,
    select,
    union,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs.sql.tables import (
    ONE,
    PENDING,
    RUNNING,
    job,
    queue_state,
    registry,
    schedule,
    throughput,
)

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement

    from sqla_jobs.sql.tables import AnyDelete, AnyInsert, AnyUpdate


__all__ = [
    "forget_queue",
    "known_queues",
    "pause_queue",
    "read_queue_state",
    "resume_queue",
]

#: How far back the per-minute throughput counts make a queue known: a queue whose jobs all
#: finished (completed rows are deleted) is still known while its minutes are kept.
KNOWN_THROUGHPUT_WINDOW: ColumnElement[Any] = literal_column("interval '7 days'")


def _queue() -> Any:
    # Not "queue": an UPDATE reserves a column's name for its SET values.
    return bindparam("name", type_=Text)


def pause_queue() -> AnyInsert:
    """Pause queue ``name``: insert its row paused since ``now()``, or set ``paused_at`` on its
    row if it is not paused. Returns ``paused_at`` when this statement paused it, no row when it
    was paused already (the row is locked either way, so a concurrent resume waits). Primary key."""
    stmt = pg_insert(queue_state).values(queue=_queue(), paused_at=func.now())
    return stmt.on_conflict_do_update(
        index_elements=[queue_state.c.queue],
        set_={"paused_at": func.now(), "updated_at": func.now()},
        where=queue_state.c.paused_at.is_(None),
    ).returning(queue_state.c.paused_at)


def resume_queue() -> AnyUpdate:
    """Resume queue ``name`` if it is paused: clear ``paused_at`` on its row (kept, with
    ``updated_at``). A queue without a row is not paused and gets none. Returns the queue's name
    when it was paused, else no row. Primary key; locks the row."""
    return (
        update(queue_state)
        .where(queue_state.c.queue == _queue(), queue_state.c.paused_at.is_not(None))
        .values(paused_at=null(), updated_at=func.now())
        .returning(queue_state.c.queue)
    )


def read_queue_state() -> Select[Any]:
    """The row of queue ``name``, locked (``FOR UPDATE``, so a decision on it holds until
    commit): ``paused_at`` (NULL: active). No row: never paused. Primary key."""
    return select(queue_state.c.paused_at).where(queue_state.c.queue == _queue()).with_for_update()


def forget_queue() -> AnyDelete:
    """Delete the row of queue ``name`` (its pause and ``updated_at``): the queue is active and
    shown only while jobs or workers name it. Returns ``paused_at`` if there was a row. Primary
    key."""
    return (
        delete(queue_state)
        .where(queue_state.c.queue == _queue())
        .returning(queue_state.c.paused_at)
    )


def _distinct_pending(name: str, where: tuple[ColumnElement[bool], ...]) -> Any:
    # A loose index scan: one descent of the index per queue present, never a read of the jobs
    # behind each (PostgreSQL before 18 cannot skip through an index itself).
    def first_after(previous: ColumnElement[str] | None) -> Any:
        after = () if previous is None else (job.c.queue > previous,)
        return (
            select(job.c.queue)
            .where(*where, *after)
            .order_by(job.c.queue)
            .limit(ONE)
            .scalar_subquery()
        )

    seen = select(first_after(None).label("queue")).cte(name, recursive=True)
    step = select(first_after(seen.c.queue).label("queue")).where(seen.c.queue.is_not(None))
    return seen.union_all(step)


def known_queues() -> Select[Any]:
    """Every queue the database knows of, by name, without reading the jobs behind each: those
    with pending jobs (loose index scans of ``sqla_jobs_job_claim_idx``,
    ``sqla_jobs_job_keyed_idx`` and ``sqla_jobs_job_rated_idx``, one descent per queue), with running jobs
    (``sqla_jobs_job_running_idx``: a handful of rows), whose jobs finished in the last 7 days
    as far as ``sqla_jobs_throughput`` keeps them (its primary key's leading ``minute``), of a
    schedule's last job (primary-key probes), or served by a live worker (``expires_at`` not
    passed); not those known only by their row in ``sqla_jobs_queue``. Dead and cancelled jobs older than the throughput
    counts are not read: the job table has no index that finds their queues. No locks."""
    unkeyed = _distinct_pending(
        "pending_queues",
        (job.c.state == PENDING, job.c.concurrency_key.is_(None), job.c.rate_key.is_(None)),
    )
    keyed = _distinct_pending(
        "keyed_queues",
        (job.c.state == PENDING, job.c.concurrency_key.is_not(None), job.c.rate_key.is_(None)),
    )
    rated = _distinct_pending("rated_queues", (job.c.state == PENDING, job.c.rate_key.is_not(None)))
    served = func.unnest(registry.c.queues).table_valued("queue").render_derived("served")
    every = union(
        select(unkeyed.c.queue).where(unkeyed.c.queue.is_not(None)),
        select(keyed.c.queue).where(keyed.c.queue.is_not(None)),
        select(rated.c.queue).where(rated.c.queue.is_not(None)),
        select(job.c.queue).where(job.c.state == RUNNING),
        select(throughput.c.queue).where(
            throughput.c.minute >= func.now() - KNOWN_THROUGHPUT_WINDOW
        ),
        select(job.c.queue).select_from(schedule.join(job, job.c.id == schedule.c.last_job_id)),
        select(served.c.queue)
        .select_from(registry)
        .join(served, literal_column("true"))
        .where(registry.c.expires_at >= func.now()),
    ).subquery("known")
    return select(every.c.queue).order_by(every.c.queue)
