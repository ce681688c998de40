"""The leases of running jobs: the heartbeat that extends them, the check of which are still held, a
durable step recorded under one, and the reaper that returns the jobs whose lease expired.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Interval,
    Select,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy import all_ as all_of
from sqlalchemy.dialects.postgresql import JSONB, UUID

from sqla_jobs.model import (
    MAX_ERROR_CHARS,
)
from sqla_jobs.sql.tables import (
    CANCELLED,
    DEAD,
    PENDING,
    RUNNING,
    append_error,
    fenced,
    given_back,
    held_pairs,
    job,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyUpdate


__all__ = [
    "heartbeat",
    "held_leases",
    "reap",
    "record_step",
    "release_orphans",
]


def heartbeat() -> AnyUpdate:
    """Extend the leases of the (``ids``, ``tokens``) pairs still held to ``now() + lease``;
    returns the ids whose lease was extended, and whether an operator asked to cancel each (the
    floor under the cancel NOTIFY).

    Never waits for a row lock: a row someone else has locked (an operator's ``SELECT ... FOR
    UPDATE``, the application's own ``with_for_update()``) is skipped, so it delays at most its
    own renewal. A missing id is therefore lost or locked: :func:`held_leases` tells which.
    Touches only ``lease_expires_at``, which no index covers, so the update can be HOT.
    """
    held = held_pairs()
    mine = (
        select(job.c.id)
        .where(fenced(held))
        .with_for_update(of=job, skip_locked=True)
        .cte("mine")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(job)
        .where(job.c.id == mine.c.id)
        .values(lease_expires_at=func.now() + bindparam("lease", type_=Interval))
        .returning(job.c.id, job.c.cancel_requested_at.is_not(None))
    )


def held_leases() -> Select[tuple[int]]:
    """Which of the (``ids``, ``tokens``) pairs are still held: the ids whose row carries the
    token. A plain read, so it never waits for a row lock; the heartbeat runs it for the ids it
    could not renew, to tell a lost lease from a locked row."""
    held = held_pairs()
    return select(job.c.id).where(fenced(held))


def reap() -> AnyUpdate:
    """Return up to ``limit`` jobs whose lease expired to ``pending``, or ``dead`` once their crash
    budget (``max_crashes``) is spent, or ``cancelled`` if its cancel was requested; counts the
    crash (and an entry in ``errors``), not a handler failure.

    Safe with several reapers at once: the selection skips rows another reaper (or a heartbeat)
    holds. Served by ``sqla_jobs_job_running_idx`` (running rows only). Returns id, kind, state,
    crashes, the worker that lost the lease, and the queue (to wake its workers).
    """
    expired = (
        select(job.c.id, job.c.locked_by)
        .where(job.c.state == RUNNING, job.c.lease_expires_at < func.now())
        .order_by(job.c.lease_expires_at)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update(skip_locked=True)
        .cte("expired")
        .prefix_with("MATERIALIZED")
    )
    spent = job.c.crashes + 1 >= job.c.max_crashes
    cancelled = job.c.cancel_requested_at.is_not(None)
    message = "worker " + func.coalesce(job.c.locked_by, "?") + " stopped heartbeating"
    return (
        update(job)
        .where(job.c.id == expired.c.id)
        .values(
            state=case((cancelled, CANCELLED), (spent, DEAD), else_=PENDING),
            crashes=job.c.crashes + 1,
            run_at=func.now(),
            finished_at=case((or_(cancelled, spent), func.now()), else_=null()),
            last_error=func.left("lease expired: " + message, MAX_ERROR_CHARS),
            errors=append_error(literal_column("'LeaseExpired'"), message, null()),
            lease_token=null(),
            lease_expires_at=null(),
            locked_by=null(),
        )
        .returning(
            job.c.id, job.c.kind, job.c.state, job.c.crashes, expired.c.locked_by, job.c.queue
        )
    )


def record_step() -> AnyUpdate:
    """Record the JSON result ``value`` of durable step ``name`` of job ``id``, fenced on lease
    ``token``; returns the id (no row: the lease was lost). Touches only ``steps``, which no index
    covers, so the update can be HOT. Served by the primary key."""
    return (
        update(job)
        .where(job.c.id == bindparam("id", type_=BigInteger))
        .where(job.c.lease_token == bindparam("token", type_=UUID(as_uuid=True)))
        .values(
            steps=func.coalesce(job.c.steps, cast(literal_column("'{}'"), JSONB)).op("||")(
                func.jsonb_build_object(
                    bindparam("name", type_=Text), cast(bindparam("value", type_=Text), JSONB)
                )
            )
        )
        .returning(job.c.id)
    )


def release_orphans() -> AnyUpdate:
    """The running jobs the table says worker ``worker`` holds, under none of the lease ``tokens``
    it holds: back to ``pending`` at their old place in line, the claim's attempt undone, counted
    as interrupted (their handlers had run), like a release. A job whose cancel was requested is
    ``cancelled`` instead. Returns id, kind, state. Served by ``sqla_jobs_job_running_idx``
    (running rows only).

    After a failover that lost commits (asynchronous replication), a job completed or given back
    on the old primary is still ``running`` on the new one under a lease its worker dropped; its
    worker, back from the outage, gives it back, where the reaper would charge it a crash.
    """
    tokens = bindparam("tokens", type_=ARRAY(UUID(as_uuid=True)))
    return (
        update(job)
        .where(
            job.c.state == RUNNING,
            job.c.locked_by == bindparam("worker", type_=Text),
            job.c.lease_token != all_of(tokens),
        )
        .values(**given_back(1))
        .returning(job.c.id, job.c.kind, job.c.state)
    )
