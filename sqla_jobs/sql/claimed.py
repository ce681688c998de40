"""What a claim does to the rows it picked and what it returns: ``running`` under one fresh lease
token per claim, and the columns a worker builds its ``ClaimedJob`` from, in claim order (with the
job's ``meta`` and ``due_at`` when asked). Shared by every claim of :mod:`~sqla_jobs.sql.claim`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Interval,
    Select,
    Text,
    Update,
    bindparam,
    cast,
    func,
    literal_column,
    select,
)

from sqla_jobs.sql.tables import RUNNING, job

__all__ = ["CLAIMED_COLUMNS", "mark_claimed"]


#: Columns a worker needs from a claimed job (``created_at`` returned as ``created_us``, integer
#: microseconds since the epoch).
CLAIMED_COLUMNS = (
    job.c.id,
    job.c.queue,
    job.c.kind,
    job.c.payload,
    job.c.priority,
    job.c.attempts,
    job.c.max_attempts,
    job.c.crashes,
    job.c.max_crashes,
    job.c.interruptions,
    job.c.lease_token,
    job.c.created_at,
    job.c.concurrency_key,
    job.c.steps,
)


def mark_claimed(stmt: Update, meta: bool, due_at: bool) -> Select[Any]:
    """``stmt`` (an UPDATE of the picked jobs) claiming them, returning :data:`CLAIMED_COLUMNS`
    (``meta`` after them, ``due_at`` last, when asked) in claim order."""
    # Rows in claim order (a batch's jobs start in the order they come): fetched by primary key,
    # the UPDATE returns them in id order, so the statement sorts what it claimed.
    columns = (*CLAIMED_COLUMNS, job.c.meta) if meta else CLAIMED_COLUMNS
    claimed = (
        stmt.values(
            state=RUNNING,
            attempts=job.c.attempts + 1,
            # One token per claim, shared by the jobs it claims (an InitPlan, run once): the fence
            # pairs it with each job's id, and a job claimed again gets a new one. Per row,
            # gen_random_uuid() cost about 1.3 us of a claimed row's 7.
            lease_token=select(func.gen_random_uuid()).scalar_subquery(),
            lease_expires_at=func.now() + bindparam("lease", type_=Interval),
            locked_by=bindparam("worker", type_=Text),
        )
        .returning(*columns, job.c.run_at)
        .cte("claimed")
    )
    selected: list[ColumnElement[Any]] = [
        _created_us(claimed) if c is job.c.created_at else claimed.c[c.name] for c in columns
    ]
    if due_at:
        # Last, after the meta: a row's due_at is its last element (context.due_at).
        selected.append(_due_at(claimed))
    return select(*selected).order_by(claimed.c.priority, claimed.c.run_at, claimed.c.id)


#: Microseconds per second, a literal of the statement (not a parameter).
_MICROS: ColumnElement[int] = literal_column("1000000")


def _created_us(claimed: Any) -> ColumnElement[int]:
    # The job's created_at as integer microseconds since the epoch: a timestamptz costs the
    # worker ~0.8 us per row to parse (a time zone conversion), an int8 almost nothing, and the
    # worker builds ctx.created_at only when a handler reads it. Exact: a float8 epoch is within
    # 0.25 us of the stored microsecond until 2255, and the cast rounds to the nearest.
    epoch = func.date_part(literal_column("'epoch'"), claimed.c.created_at)
    return cast(epoch * _MICROS, BigInteger).label("created_us")


def _due_at(claimed: Any) -> ColumnElement[int]:
    # When the job became due, in microseconds on the worker's time.monotonic() clock:
    # ``monotonic_us`` is that clock when the worker sent the claim, and the job had then been
    # due for now() - run_at by the database's clock (the clock run_at is on), so a worker whose
    # own clock is off still measures its pickup delay right. An int8 rather than a float8 (half
    # the cost to print and parse); only a worker with metrics or the throughput tally asks.
    age = func.date_part(literal_column("'epoch'"), func.now() - claimed.c.run_at)
    return (bindparam("monotonic_us", 0, type_=BigInteger) - cast(age * _MICROS, BigInteger)).label(
        "due_us"
    )
