"""The listings of jobs and queues an operator reads (``sqla-jobs jobs list``, the dashboard): plain
reads, no payloads, no locks.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Select,
    Text,
    bindparam,
    func,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB

from sqla_jobs.sql.tables import (
    job,
    queue_state,
)

__all__ = [
    "list_jobs",
    "list_jobs_page",
    "list_queue_states",
]


def list_jobs() -> Select[Any]:
    """Up to ``limit`` jobs, newest id first, without their payload or errors: those in one of
    ``states`` (a text array; NULL: any), of ``queue`` and ``kind`` (NULL: any), whose ``meta``
    contains ``meta`` (jsonb ``@>``; NULL: any). For ``sqla-jobs jobs list``. No locks; the
    primary key read backwards, filtered (an operator's listing, not a hot path)."""
    states = bindparam("states", type_=ARRAY(Text))
    queue = bindparam("queue", type_=Text)
    kind = bindparam("kind", type_=Text)
    meta = bindparam("meta", type_=JSONB(none_as_null=True))
    return (
        select(
            job.c.id,
            job.c.queue,
            job.c.kind,
            job.c.state,
            job.c.priority,
            job.c.attempts,
            job.c.max_attempts,
            job.c.crashes,
            job.c.interruptions,
            job.c.run_at,
            job.c.created_at,
            job.c.finished_at,
            job.c.cancel_requested_at,
            job.c.last_error,
            job.c.meta,
        )
        .where(
            or_(states.is_(None), job.c.state == func.any(states)),
            or_(queue.is_(None), job.c.queue == queue),
            or_(kind.is_(None), job.c.kind == kind),
            or_(meta.is_(None), job.c.meta.contains(meta)),
        )
        .order_by(job.c.id.desc())
        .limit(bindparam("limit", type_=BigInteger))
    )


def list_jobs_page() -> Select[Any]:
    """:func:`list_jobs` (same parameters and columns) below id ``before``: one page of a listing
    paged by keyset, the next page starting below the last id shown, so a deep page costs what
    the first does and a job enqueued meanwhile never shifts a page (no OFFSET). For the
    dashboard. No locks; the primary key read backwards from ``before``, filtered."""
    return list_jobs().where(job.c.id < bindparam("before", type_=BigInteger))


def list_queue_states() -> Select[Any]:
    """Every queue an operator paused or resumed (``sqla_jobs_queue``): name, ``paused_at``
    (NULL: active) and ``updated_at``, by name. No locks; a scan of a table of a few rows."""
    return select(queue_state.c.queue, queue_state.c.paused_at, queue_state.c.updated_at).order_by(
        queue_state.c.queue
    )
