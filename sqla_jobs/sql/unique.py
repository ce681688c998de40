"""Unique jobs: their own INSERT ... ON CONFLICT statements, so that plain enqueues never pay for
them; the lookups of a key's holder; and what ``retry`` must not collide with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import BindParameter

from sqla_jobs.model import (
    UNIQUE_PREDICATE,
    Job,
)
from sqla_jobs.sql import columns as _row
from sqla_jobs.sql.tables import (
    PENDING,
    ids_param,
    job,
    requested_run_at,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyInsert

from sqla_jobs.sql.enqueue import BULK_ARRAY_PARAMS, BULK_COLUMNS, FILLED_COLUMNS, bound_values

__all__ = [
    "REPLACED_COLUMNS",
    "UNIQUE_ARRAY_PARAMS",
    "find_unique_job",
    "find_unique_jobs",
    "insert_unique_job",
    "insert_unique_jobs",
    "unique_holders",
    "upsert_unique_job",
    "upsert_unique_jobs",
]


def _unique_key(key: ColumnElement[str], period: ColumnElement[int]) -> ColumnElement[str]:
    # With a period, the key of the window holding the job's run_at, by the database's clock
    # (``requested_run_at()``: ``now()`` is the transaction's start, so every statement of the caller's
    # transaction computes the same window).
    window = (
        cast(func.floor(func.extract("epoch", requested_run_at()) / period), BigInteger) * period
    )
    return case((period.is_(None), key), else_=key + literal_column("'@'") + cast(window, Text))


_UNIQUE_WHERE = text(UNIQUE_PREDICATE)


#: What ``on_conflict="replace"`` changes in the pending job that holds the key.
REPLACED_COLUMNS = ("payload", "run_at", "priority", "meta")


def _on_unique_conflict(stmt: Any, replace: bool) -> Any:
    if not replace:
        return stmt.on_conflict_do_nothing(index_elements=["unique_key"], index_where=_UNIQUE_WHERE)
    return stmt.on_conflict_do_update(
        index_elements=["unique_key"],
        index_where=_UNIQUE_WHERE,
        set_={name: stmt.excluded[name] for name in REPLACED_COLUMNS},
        # A job that has started (running, or finished in a state that counts) is left as it is.
        where=job.c.state == PENDING,
    )


def _was_inserted() -> ColumnElement[bool]:
    # A row version an INSERT created has no deleting transaction; one ON CONFLICT DO UPDATE
    # wrote has its own (PostgreSQL's documented way to tell the two apart in RETURNING).
    return (literal_column(f"{job.name}.xmax") == literal_column("'0'")).label("inserted")


def insert_unique_job(replace: bool = False) -> AnyInsert:
    """Insert one unique job, unless a job with its key is in a state that counts for that job:
    ``INSERT ... ON CONFLICT ON the unique index DO NOTHING`` (``replace``: ``DO UPDATE`` the
    payload, run_at, priority and meta of that job if it is pending). Returns the
    :data:`FILLED_COLUMNS`, ``unique_key`` (as stored) and ``inserted`` for the row written; no row when the key was taken
    (and, with ``replace``, the holder was not pending). Never raises for a duplicate: the
    caller's transaction stays usable.

    Parameters: those of :func:`insert_job` (meta included), ``unique_key``, ``unique_states``
    (a text array) and ``unique_period`` (seconds, or NULL). Locks the new row, or the holder's
    row with ``replace``; a concurrent insert of the same key waits for this transaction to end.
    Served by the unique index.
    """
    stmt = pg_insert(Job).values(
        {
            **bound_values(),
            "run_at": requested_run_at(),
            "unique_key": _unique_key(_key_param(), _period_param()),
            "unique_states": bindparam("unique_states", type_=ARRAY(Text)),
        }
    )
    return _on_unique_conflict(stmt, replace).returning(  # type: ignore[no-any-return]
        *FILLED_COLUMNS, job.c.unique_key, _was_inserted()
    )


def upsert_unique_job() -> AnyInsert:
    """:func:`insert_unique_job` for ``on_conflict="replace"``: a taken key whose holder is
    pending gets this payload, run_at, priority and meta (``inserted`` false)."""
    return insert_unique_job(replace=True)


def _key_param() -> BindParameter[str]:
    return bindparam("unique_key", type_=Text)


def _period_param() -> BindParameter[int]:
    return bindparam("unique_period", type_=BigInteger)


def find_unique_job() -> Select[Any]:
    """The job holding the key :func:`insert_unique_job` found taken (same parameters:
    ``unique_key``, ``unique_period``, run_at or delay_us), as the ``Job`` entity. A new statement,
    so under READ COMMITTED it sees the holder that made the insert skip; none if that job has
    left its counted states since. No locks. Served by the unique index."""
    return select(Job).where(
        job.c.unique_key == _unique_key(_key_param(), _period_param()),
        job.c.state == func.any(job.c.unique_states),
    )


#: The arrays a bulk unique insert sends beside :data:`BULK_ARRAY_PARAMS`: the key, the counted
#: states (comma-separated: an array of arrays cannot be unnested row by row) and the period.
UNIQUE_ARRAY_PARAMS = (
    ("unique_keys", Text()),
    ("unique_states", Text()),
    ("unique_periods", BigInteger()),
)


def insert_unique_jobs(replace: bool = False) -> AnyInsert:
    """Insert many unique jobs in one statement, in the order of their keys, each unless its key
    is taken (``replace``: as :func:`insert_unique_job`). Inserting in key order means two batches
    that share keys wait for each other in one order, never in a cycle: no deadlock between
    them. The keys must be distinct within the statement (the caller folds duplicates).

    Parameters: the arrays of :func:`insert_jobs` and of :data:`UNIQUE_ARRAY_PARAMS`, and one
    run_at or delay_us. Returns ``id``, ``unique_key`` (as stored, with the period's window) and
    ``inserted`` for each row written. Served by the unique index.
    """
    names = (*BULK_COLUMNS, "unique_key", "unique_states", "unique_period")
    params = (*BULK_ARRAY_PARAMS, *UNIQUE_ARRAY_PARAMS)
    rows = (
        func.unnest(*(bindparam(name, type_=ARRAY(type_)) for name, type_ in params))
        .table_valued(*(column(n, t) for n, (_, t) in zip(names, params, strict=True)))
        .render_derived(name="r")
    )
    key = _unique_key(rows.c.unique_key, rows.c.unique_period).label("held_key")
    src = (
        select(
            *(cast(rows.c[c.name], JSONB) if c.json else rows.c[c.name] for c in _row.COLUMNS),
            requested_run_at(),
            key,
            func.string_to_array(rows.c.unique_states, literal_column("','")),
        )
        .select_from(rows)
        .order_by(key)
    )
    stmt = pg_insert(job).from_select([*BULK_COLUMNS, "run_at", "unique_key", "unique_states"], src)
    return _on_unique_conflict(stmt, replace).returning(  # type: ignore[no-any-return]
        job.c.id, job.c.unique_key, _was_inserted()
    )


def upsert_unique_jobs() -> AnyInsert:
    """:func:`insert_unique_jobs` for ``on_conflict="replace"``, as :func:`upsert_unique_job`."""
    return insert_unique_jobs(replace=True)


def find_unique_jobs() -> Select[Any]:
    """For each key of ``unique_keys`` (with ``unique_periods``, and the batch's run_at or
    delay_us), the job holding it now, as (position from 1, id). No locks. Served by the unique
    index, one probe per key."""
    keys = (
        func.unnest(
            bindparam("unique_keys", type_=ARRAY(Text)),
            bindparam("unique_periods", type_=ARRAY(BigInteger)),
        )
        .table_valued(column("key", Text), column("period", BigInteger), with_ordinality="i")
        .render_derived(name="k")
    )
    return (
        select(keys.c.i, job.c.id)
        .select_from(keys)
        .join(
            job,
            and_(
                job.c.unique_key == _unique_key(keys.c.key, keys.c.period),
                job.c.state == func.any(job.c.unique_states),
            ),
        )
    )


def unique_holders() -> Select[Any]:
    """For each job of ``ids`` that has a unique key, the other jobs with that key that hold it
    now (in a state counting for it) or are among ``ids``, as (id, other's id, whether the other
    holds it): what ``retry`` must not collide with. No locks. The primary key, then a scan of
    the key's entries (the unique index serves the holders)."""
    holder = job.alias("holder")
    holds = holder.c.state == func.any(holder.c.unique_states)

    def others(condition: ColumnElement[bool]) -> Select[Any]:
        return (
            select(job.c.id, holder.c.id.label("other"), holds.label("holds"))
            .join(
                holder,
                and_(holder.c.unique_key == job.c.unique_key, condition, holder.c.id != job.c.id),
            )
            .where(job.c.id == func.any(ids_param()))
        )

    # Two lookups rather than one OR, which no index serves: the holders through the unique
    # index, the other jobs being retried through the primary key.
    both = others(holds).union(others(holder.c.id == func.any(ids_param()))).subquery("others")
    return select(both.c.id, both.c.other, both.c.holds).order_by(both.c.id, both.c.other)
