"""What the builders share: the tables, the state literals, the advisory lock namespace, the
parameters of jobs held by (id, lease token) pairs and of a job's requested run_at, and the
tables' names as SQL text.

State constants are SQL literals, never bound: the claim index is partial
(``WHERE state = 'pending'``) and the planner can only prove a *generic* plan (what psycopg's
prepared statements run after five executions) uses it when the predicate's value is in the text.
Time always comes from the database (``now()``): a bound duration is only ever added to it.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Table,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    null,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.dialects.postgresql import dialect as _pg_dialect
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import BindParameter

from sqla_jobs.model import (
    MAX_ERROR_CHARS,
    Job,
    JobHistory,
    QueueState,
    RateLimiter,
    RegisteredWorker,
    Schedule,
    ThroughputMinute,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import Unpack

    AnyInsert: TypeAlias = ReturningInsert[Unpack[tuple[Any, ...]]]
    AnyUpdate: TypeAlias = ReturningUpdate[Unpack[tuple[Any, ...]]]
    AnyDelete: TypeAlias = ReturningDelete[Unpack[tuple[Any, ...]]]


__all__ = [
    "ADVISORY_NAMESPACE",
    "CANCELLED",
    "COMPLETED",
    "DEAD",
    "MAX_ERRORS",
    "MAX_TRACEBACK_CHARS",
    "ONE",
    "ONE_MICROSECOND",
    "ONE_SECOND",
    "PENDING",
    "PG_DIALECT",
    "RUNNING",
    "append_error",
    "fenced",
    "given_back",
    "held_pairs",
    "history",
    "history_table_name",
    "ids_param",
    "job",
    "job_table_name",
    "queue_state",
    "rate_limiter",
    "registry",
    "requested_run_at",
    "schedule",
    "schedule_table_name",
    "throughput",
    "tokens_param",
]


PG_DIALECT = _pg_dialect()  # type: ignore[no-untyped-call]

job = typing.cast(Table, Job.__table__)
history = typing.cast(Table, JobHistory.__table__)
queue_state = typing.cast(Table, QueueState.__table__)
schedule = typing.cast(Table, Schedule.__table__)
registry = typing.cast(Table, RegisteredWorker.__table__)
throughput = typing.cast(Table, ThroughputMinute.__table__)
rate_limiter = typing.cast(Table, RateLimiter.__table__)

PENDING: ColumnElement[str] = literal_column("'pending'")
RUNNING: ColumnElement[str] = literal_column("'running'")
DEAD: ColumnElement[str] = literal_column("'dead'")
COMPLETED: ColumnElement[str] = literal_column("'completed'")
CANCELLED: ColumnElement[str] = literal_column("'cancelled'")


#: The most per-attempt error entries a job keeps (the oldest go first), and the most characters
#: of a traceback in one.
MAX_ERRORS = 25
MAX_TRACEBACK_CHARS = 4000
ONE_SECOND: ColumnElement[Any] = literal_column("interval '1 second'")
ONE_MICROSECOND: ColumnElement[Any] = literal_column("interval '1 microsecond'")


#: A literal LIMIT 1: a bound one leaves a generic plan guessing how many rows a step fetches.
ONE: ColumnElement[int] = literal_column("1")


#: First key of the two-key advisory locks sqla-jobs takes (hashtext('sqla_jobs')): a namespace so
#: our locks cannot collide with the application's single-key advisory locks.
ADVISORY_NAMESPACE = -1196525586


def ids_param() -> BindParameter[Any]:
    """The ``ids`` parameter: a bigint array of job ids."""
    return bindparam("ids", type_=ARRAY(BigInteger()))


def tokens_param() -> BindParameter[Any]:
    """The ``tokens`` parameter: a uuid array of lease tokens, parallel to ``ids``."""
    return bindparam("tokens", type_=ARRAY(UUID(as_uuid=True)))


def held_pairs() -> Any:
    """The (id, token) pairs a worker holds, as a table: ``ids`` and ``tokens`` are parallel
    arrays, one token per id."""
    return (
        func.unnest(ids_param(), tokens_param())
        .table_valued("id", "token")
        .render_derived(name="held")
    )


def fenced(held: Any) -> ColumnElement[bool]:
    """The job rows matching the (id, token) pairs of :func:`held_pairs`."""
    # Matched as exact (id, token) pairs, never as two sets: a process may hold a job under an old
    # claim (its lease lost, its handler still running) while it holds the same job again under a
    # new one, and one claim's id must not pair with the other claim's token. A nested loop over
    # the pairs, each a primary-key lookup.
    return and_(job.c.id == held.c.id, job.c.lease_token == held.c.token)


def given_back(interrupted: ColumnElement[Any] | int) -> dict[str, Any]:
    """The values of a job given back unfinished (a release, an orphan after an outage): pending
    at its old place in line, lease cleared, the claim's attempt undone (neither a failure nor a
    crash), ``interruptions`` grown by ``interrupted``; ``cancelled`` if its cancel was asked."""
    cancelled = job.c.cancel_requested_at.is_not(None)
    return {
        "state": case((cancelled, CANCELLED), else_=PENDING),
        "finished_at": case((cancelled, func.now()), else_=null()),
        "attempts": func.greatest(job.c.attempts - 1, 0),
        "interruptions": job.c.interruptions + interrupted,
        "lease_token": null(),
        "lease_expires_at": null(),
        "locked_by": null(),
    }


def requested_run_at() -> ColumnElement[object]:
    """A new job's run_at: ``run_at`` if bound, else the database's ``now()`` plus ``delay_us``."""
    return func.coalesce(
        bindparam("run_at", type_=job.c.run_at.type),
        # Bound as microseconds, not as an interval: an interval's days are calendar days in the
        # session's time zone, so now() + '1 day' across a DST change is 23 or 25 hours.
        func.now() + bindparam("delay_us", type_=BigInteger) * ONE_MICROSECOND,
    )


def append_error(
    error_class: ColumnElement[Any], message: ColumnElement[Any], trace: ColumnElement[Any]
) -> ColumnElement[Any]:
    """``errors`` with this attempt's entry appended, the oldest dropped past :data:`MAX_ERRORS`."""
    # One entry per attempt, the last MAX_ERRORS kept: jsonb's `- 0` drops the oldest.
    entry = func.jsonb_build_array(
        func.jsonb_build_object(
            literal_column("'attempt'"),
            job.c.attempts,
            literal_column("'at'"),
            func.now(),
            literal_column("'error'"),
            error_class,
            literal_column("'message'"),
            func.left(message, MAX_ERROR_CHARS),
            literal_column("'traceback'"),
            func.left(trace, MAX_TRACEBACK_CHARS),
        )
    )
    appended = func.coalesce(job.c.errors, cast(literal_column("'[]'"), JSONB)).op("||")(entry)
    full = func.coalesce(func.jsonb_array_length(job.c.errors), 0) >= MAX_ERRORS
    return case((full, appended.op("-")(literal_column("0"))), else_=appended)


def job_table_name(schema: str | None = None) -> str:
    """The job table's name as SQL text, schema-qualified and quoted where needed: for ``COPY``
    and for the ``table`` parameter of :func:`reserve_job_ids`."""
    return _table_name(job, schema)


def schedule_table_name(schema: str | None = None) -> str:
    """:func:`job_table_name` for ``sqla_jobs_schedule``."""
    return _table_name(schedule, schema)


def history_table_name(schema: str | None = None) -> str:
    """:func:`job_table_name` for ``sqla_jobs_history``."""
    return _table_name(history, schema)


def _table_name(table: Table, schema: str | None) -> str:
    quote = PG_DIALECT.identifier_preparer.quote
    return quote(table.name) if schema is None else f"{quote(schema)}.{quote(table.name)}"
