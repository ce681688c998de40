"""The registry of live workers (``sqla_jobs_worker``): a worker's registration and heartbeat, its
goodbye, the pruning of those that vanished, and the listing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Integer,
    Interval,
    Select,
    Text,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs.sql.tables import (
    RUNNING,
    job,
    registry,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyDelete, AnyInsert


__all__ = [
    "list_workers",
    "prune_workers",
    "register_worker",
    "stale_worker_jobs",
    "unregister_worker",
]


def register_worker() -> AnyInsert:
    """Register worker ``name`` (``host``, ``pid``, ``queues``, ``concurrency``) as alive until
    ``now() + ttl``, or move the heartbeat of its row forward: one upsert for the start and every
    heartbeat, so a row pruned while the worker was away from the database comes back at its next
    beat (its ``started_at`` then being that beat). Locks only that row; a primary-key probe of a
    table of a few rows. Returns the name."""
    values = {
        "name": bindparam("name", type_=Text),
        "host": bindparam("host", type_=Text),
        "pid": bindparam("pid", type_=Integer),
        "queues": bindparam("queues", type_=ARRAY(Text)),
        "concurrency": bindparam("concurrency", type_=Integer),
        "expires_at": func.now() + bindparam("ttl", type_=Interval),
    }
    stmt = pg_insert(registry).values(**values)
    return stmt.on_conflict_do_update(
        index_elements=[registry.c.name],
        set_={"heartbeat_at": func.now(), "expires_at": stmt.excluded.expires_at},
    ).returning(registry.c.name)


def unregister_worker() -> AnyDelete:
    """Delete the row of worker ``name`` (its graceful stop). Returns the name if it was there."""
    return (
        delete(registry)
        .where(registry.c.name == bindparam("name", type_=Text))
        .returning(registry.c.name)
    )


def prune_workers() -> AnyDelete:
    """Delete the rows of workers stale for longer than ``grace`` (an interval) by the database's
    clock (``expires_at`` passed: killed, or away from the database) that hold no running job any
    more: a dead worker's row stays, marked stale, while the reaper has not yet taken its jobs.
    Returns their names. A scan of a table of a few rows, and per stale row a look through the
    running jobs (``sqla_jobs_job_running_idx`` holds only them, but not ``locked_by``: each one's
    row is read); locks the rows it deletes (a worker's beat of its own row waits for it)."""
    holds = exists().where(job.c.state == RUNNING, job.c.locked_by == registry.c.name)
    return (
        delete(registry)
        .where(
            registry.c.expires_at < func.now() - bindparam("grace", type_=Interval),
            ~holds,
        )
        .returning(registry.c.name)
    )


def list_workers() -> Select[Any]:
    """Every registered worker, oldest first: name, host, pid, queues, concurrency, started_at,
    heartbeat_at, seconds since that heartbeat by the database's clock, and whether the row is
    stale (``expires_at`` passed: it missed two heartbeats; not yet pruned). No locks."""
    since = func.date_part(literal_column("'epoch'"), func.now() - registry.c.heartbeat_at)
    return select(
        registry.c.name,
        registry.c.host,
        registry.c.pid,
        registry.c.queues,
        registry.c.concurrency,
        registry.c.started_at,
        registry.c.heartbeat_at,
        since.label("heartbeat_age"),
        (registry.c.expires_at < func.now()).label("stale"),
    ).order_by(registry.c.started_at, registry.c.name)


def stale_worker_jobs() -> Select[Any]:
    """Which of the jobs ``ids`` (a bigint array) run on a stale worker (its row's ``expires_at``
    passed): id, the worker's name, seconds since its last heartbeat by the database's clock, and
    the job's ``lease_expires_at`` (when the reaper may take it back). For the listings of
    running jobs, one statement per listing. No locks; a primary-key probe per id and of the
    registry."""
    since = func.date_part(literal_column("'epoch'"), func.now() - registry.c.heartbeat_at)
    return (
        select(
            job.c.id,
            job.c.locked_by,
            since.label("heartbeat_age"),
            job.c.lease_expires_at,
        )
        .join(registry, registry.c.name == job.c.locked_by)
        .where(
            job.c.id == func.any(bindparam("ids", type_=ARRAY(BigInteger))),
            job.c.state == RUNNING,
            registry.c.expires_at < func.now(),
        )
        .order_by(job.c.id)
    )
