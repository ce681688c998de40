"""The only home of SQL: pure builders of Core statements, no I/O.

Each function builds one statement, named by its verb; the docstring says what it locks, what it
returns and which index serves it. ``tests/unit/test_statements.py`` compiles every one for
PostgreSQL and compares it with ``tests/sql/<name>.sql``, so a change here is a plain diff in review.

Time always comes from the database (``now()``): a bound ``timedelta`` is only ever added to it.

State constants are rendered as SQL literals, never bound: the claim index is partial
(``WHERE state = 'pending'``) and the planner can only prove a *generic* plan (what psycopg's
prepared statements run after five executions) uses it when the predicate's value is in the text.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Column,
    ColumnElement,
    Delete,
    Float,
    Insert,
    Integer,
    Interval,
    MetaData,
    Select,
    String,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy import (
    table as sa_table,
)
from sqlalchemy.dialects.postgresql import JSONB, REGCLASS, UUID
from sqlalchemy.dialects.postgresql import dialect as _pg_dialect
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.schema import DropTable
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import BindParameter, TextClause
from sqlalchemy.sql.selectable import TableClause

from sqla_jobs.model import (
    MAX_ERROR_CHARS,
    UNIQUE_PREDICATE,
    VERSION_TABLE,
    Job,
    JobHistory,
    QueueState,
    RegisteredWorker,
    Schedule,
    ThroughputMinute,
)
from sqla_jobs.sql import columns as _row

if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import Unpack

    AnyInsert: TypeAlias = ReturningInsert[Unpack[tuple[Any, ...]]]
    AnyUpdate: TypeAlias = ReturningUpdate[Unpack[tuple[Any, ...]]]
    AnyDelete: TypeAlias = ReturningDelete[Unpack[tuple[Any, ...]]]

_PG = _pg_dialect()  # type: ignore[no-untyped-call]
job = typing.cast(Table, Job.__table__)
history = typing.cast(Table, JobHistory.__table__)
queue_state = typing.cast(Table, QueueState.__table__)
schedule = typing.cast(Table, Schedule.__table__)
registry = typing.cast(Table, RegisteredWorker.__table__)
throughput = typing.cast(Table, ThroughputMinute.__table__)

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

#: Columns a worker needs from a claimed job.
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


def _ids() -> BindParameter[Any]:
    return bindparam("ids", type_=ARRAY(BigInteger()))


def _tokens() -> BindParameter[Any]:
    return bindparam("tokens", type_=ARRAY(UUID(as_uuid=True)))


def _held() -> Any:
    """The (id, token) pairs a worker holds, as a table: ``ids`` and ``tokens`` are parallel
    arrays, one token per id."""
    return func.unnest(_ids(), _tokens()).table_valued("id", "token").render_derived(name="held")


def _fenced(held: Any) -> ColumnElement[bool]:
    # Matched as exact (id, token) pairs, never as two sets: a process may hold a job under an old
    # claim (its lease lost, its handler still running) while it holds the same job again under a
    # new one, and one claim's id must not pair with the other claim's token. A nested loop over
    # the pairs, each a primary-key lookup.
    return and_(job.c.id == held.c.id, job.c.lease_token == held.c.token)


def _run_at() -> ColumnElement[object]:
    return func.coalesce(
        bindparam("run_at", type_=job.c.run_at.type),
        # Bound as microseconds, not as an interval: an interval's days are calendar days in the
        # session's time zone, so now() + '1 day' across a DST change is 23 or 25 hours.
        func.now() + bindparam("delay_us", type_=BigInteger) * ONE_MICROSECOND,
    )


#: What the database fills in when a job is inserted: an insert returns these, and enqueue builds
#: the rest of the ``Job`` from what it bound.
FILLED_COLUMNS = (
    job.c.id,
    job.c.state,
    job.c.run_at,
    job.c.attempts,
    job.c.crashes,
    job.c.interruptions,
    job.c.created_at,
)


def insert_job(lean: bool = False) -> AnyInsert:
    """Insert one job; returns the :data:`FILLED_COLUMNS` (id, state, run_at, attempts, crashes,
    interruptions, created_at).

    Parameters: queue, kind, payload (JSON text), priority, max_attempts, max_crashes,
    concurrency_key and concurrency_limit (both NULL for an unkeyed job), meta (JSON text or NULL),
    and either run_at (aware datetime) or delay_us (microseconds, added to the database's
    ``now()``). Locks nothing beyond the new row. ``lean``: without the optional columns (meta),
    for a job that has none of them.
    """
    return _insert_values(lean).returning(*FILLED_COLUMNS)


def _insert_values(lean: bool) -> Insert:
    return insert(Job).values({**_values(lean), "run_at": _run_at()})


def _values(lean: bool = False) -> dict[str, Any]:
    # Each value bound as its column's type, the payload as text cast to jsonb.
    return {
        c.name: cast(bindparam(c.name, type_=Text), JSONB)
        if c.json
        else bindparam(c.name, type_=job.c[c.name].type)
        for c in _row.COLUMNS
        if not (lean and c.optional)
    }


def insert_job_and_notify(lean: bool = False) -> Select[Any]:
    """:func:`insert_job`, plus the wakeup (``pg_notify(channel, queue)``) in the same statement,
    so the first enqueue of a transaction costs one round trip; returns what :func:`insert_job` does.

    The notification is queued with the transaction and delivered only if it commits.
    """
    inserted = insert_job(lean).cte("inserted")
    # A one-row subquery joined to the insert, so the notify runs exactly once per statement.
    wakeup = select(
        func.pg_notify(bindparam("channel", type_=Text), bindparam("queue_name", type_=Text)).label(
            "notified"
        )
    ).subquery("wakeup")
    return select(*inserted.c).select_from(inserted.join(wakeup, true()))


#: The columns enqueue_many sends as parallel arrays, in unnest order.
BULK_COLUMNS = _row.NAMES
#: insert_jobs()'s array parameters, one per BULK_COLUMNS entry in the same order, with their types.
BULK_ARRAY_PARAMS = tuple((c.array, c.element) for c in _row.COLUMNS)


def insert_jobs() -> AnyInsert:
    """Insert many jobs in one statement from parallel arrays (``unnest``); returns their ids.

    Parameters: arrays of equal length queues, kinds, payloads (JSON text), priorities,
    max_attempts, max_crashes, concurrency_keys, concurrency_limits, metas (JSON text or NULL);
    and one run_at or delay_us for
    all, as in :func:`insert_job`. One round trip whatever the count, and no 65,535-parameter
    limit, because each column is one array.
    """
    rows = (
        func.unnest(*(bindparam(name, type_=ARRAY(type_)) for name, type_ in BULK_ARRAY_PARAMS))
        .table_valued(*BULK_COLUMNS)
        .render_derived(name="r")
    )
    values = [cast(rows.c[c.name], JSONB) if c.json else rows.c[c.name] for c in _row.COLUMNS]
    src = select(*values, _run_at()).select_from(rows)
    columns = [*BULK_COLUMNS, "run_at"]
    return insert(job).from_select(columns, src).returning(job.c.id)


# -- unique jobs: their own statements, so that plain enqueues never pay for them -------------


def _unique_key(key: ColumnElement[str], period: ColumnElement[int]) -> ColumnElement[str]:
    # With a period, the key of the window holding the job's run_at, by the database's clock
    # (``_run_at()``: ``now()`` is the transaction's start, so every statement of the caller's
    # transaction computes the same window).
    window = cast(func.floor(func.extract("epoch", _run_at()) / period), BigInteger) * period
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
            **_values(),
            "run_at": _run_at(),
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
            _run_at(),
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
            .where(job.c.id == func.any(_ids()))
        )

    # Two lookups rather than one OR, which no index serves: the holders through the unique
    # index, the other jobs being retried through the primary key.
    both = others(holds).union(others(holder.c.id == func.any(_ids()))).subquery("others")
    return select(both.c.id, both.c.other, both.c.holds).order_by(both.c.id, both.c.other)


def reserve_job_ids() -> Select[Any]:
    """Take ``n`` ids from the job table's identity sequence, and the run_at of a bulk enqueue.

    Returns one row: the ids (a bigint array, in the order the sequence gave them) and
    ``coalesce(run_at, now() + delay_us)`` as in :func:`insert_job`. Parameters: ``table``, the
    table's name as ``pg_get_serial_sequence`` takes it (schema-qualified and quoted where needed),
    ``n``, and run_at or delay_us. The sequence is looked up once (a materialized CTE): looked up per
    row, the text-to-regclass cast costs more than the ``nextval`` itself. Sequences are not
    transactional, so a rolled-back enqueue leaves a gap in the ids, as a rolled-back INSERT does.

    ``nextval`` needs ``USAGE`` (or ``UPDATE``) on the sequence, which an identity column's INSERT
    does not: for a role without it (an enqueuer granted only what an earlier release asked for)
    ids is NULL and no id is taken, and enqueue_many falls back to :func:`insert_jobs`.
    """
    seq = (
        select(
            cast(
                func.pg_get_serial_sequence(bindparam("table", type_=Text), literal_column("'id'")),
                REGCLASS,
            ).label("seq")
        )
        .cte("seq")
        .prefix_with("MATERIALIZED")
    )
    n = (
        func.generate_series(literal_column("1"), bindparam("n", type_=BigInteger))
        .table_valued("i")
        .render_derived()
    )
    ids = (
        select(func.array_agg(func.nextval(seq.c.seq)))
        .select_from(seq)
        .join(n, true())
        # Filtered on the CTE's one row, before any nextval runs: without the privilege, no id is
        # taken, no error aborts the caller's transaction, and ids is NULL.
        .where(func.has_sequence_privilege(seq.c.seq, literal_column("'USAGE, UPDATE'")))
    )
    return select(ids.scalar_subquery().label("ids"), _run_at().label("run_at"))


#: The columns enqueue_many writes by COPY, in row order; the rest take their defaults.
COPY_COLUMNS = ("id", *BULK_COLUMNS, "run_at")


def copy_jobs(schema: str | None = None) -> TextClause:
    """``COPY ... FROM STDIN`` into the job table, of the :data:`COPY_COLUMNS`: enqueue_many's bulk
    path, the fastest way into a table (one multi-row insert per page instead of one executor row at
    a time). ``COPY`` has no RETURNING, so the ids come first from :func:`reserve_job_ids`.

    ``schema`` qualifies the table (``schema_translate_map`` does not reach into a text statement).
    """
    columns = ", ".join(map(_PG.identifier_preparer.quote, COPY_COLUMNS))
    return text(f"COPY {job_table_name(schema)} ({columns}) FROM STDIN")


#: SAVEPOINT, ROLLBACK TO and RELEASE of the savepoint around a COPY that validates its payloads as
#: it goes: a bad one rolls the COPY back and leaves the caller's transaction usable.
COPY_SAVEPOINT = (
    "SAVEPOINT sqla_jobs_copy",
    "ROLLBACK TO SAVEPOINT sqla_jobs_copy",
    "RELEASE SAVEPOINT sqla_jobs_copy",
)


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
    quote = _PG.identifier_preparer.quote
    return quote(table.name) if schema is None else f"{quote(schema)}.{quote(table.name)}"


def notify() -> Select[tuple[object]]:
    """Queue a wakeup on ``channel`` carrying the queue name (never the payload: NOTIFY caps
    payloads at 8000 bytes). Delivered only when the surrounding transaction commits."""
    return select(func.pg_notify(bindparam("channel", type_=Text), bindparam("queue", type_=Text)))


def sleep_until() -> Select[tuple[object]]:
    """Sleep on the server until its clock passes ``until`` (at most ``cap`` seconds): run before
    a NOTIFY at a job's ``run_at``, in its transaction, so that the NOTIFY (delivered at commit)
    never precedes the time by the database's clock, however the sender's estimate of that clock
    errs."""
    until = bindparam("until", type_=job.c.run_at.type)
    wait = func.extract("epoch", until - func.clock_timestamp())
    return select(func.pg_sleep(func.least(func.greatest(wait, 0), bindparam("cap", type_=Float))))


def claim() -> Select[Any]:
    """Claim up to ``limit`` due jobs of ``queue`` for ``worker``, in one atomic statement.

    Locks the claimed rows (``FOR UPDATE SKIP LOCKED``: rows another worker holds are stepped over,
    never waited for); sets them ``running`` with a fresh lease token (one per claim) and a lease
    of ``lease`` from the database's ``now()``, and counts the attempt now, at claim time, so a job
    that kills its worker cannot be retried forever. Jobs that crashed a worker before are taken
    as :func:`_crash_rule` says (``crashed_ok``, ``last_life_ok``; both default true). Returns
    :data:`CLAIMED_COLUMNS`, in claim order. Served by ``sqla_jobs_job_claim_idx`` (partial,
    pending rows only): an ordered index scan; the only sort is of the rows it claimed.
    """
    return _claim(_due_now())


def claim_with_meta() -> Select[Any]:
    """:func:`claim`, returning each job's ``meta`` too, after :data:`CLAIMED_COLUMNS`: the claim of
    a worker whose middleware reads ``ctx.meta`` (tracing reads the trace context stored at
    enqueue). Locks and selects what :func:`claim` does; a worker without such a middleware runs
    :func:`claim` and never reads the column."""
    return _claim(_due_now(), meta=True)


def claim_with_due_at() -> Select[Any]:
    """:func:`claim`, returning each job's ``due_at`` too, as the last column: when the job became
    due, as a ``time.monotonic()`` value of the worker that sends its clock as ``monotonic``
    (:func:`_due_at`). The claim of a worker with metrics (its pickup delay); a worker without
    them runs :func:`claim` and never computes the column."""
    return _claim(_due_now(), timed=True)


def claim_with_meta_and_due_at() -> Select[Any]:
    """:func:`claim_with_meta` with ``due_at`` as the last column (:func:`claim_with_due_at`)."""
    return _claim(_due_now(), meta=True, timed=True)


def _due_now() -> tuple[ColumnElement[bool], ...]:
    return (job.c.run_at <= func.now(),)


#: Past every ``priority`` (a SMALLINT): ``(key, LAST_PRIORITY)`` sorts after all of a key's
#: index entries, so ``(concurrency_key, priority) > (key, LAST_PRIORITY)`` is the next key.
LAST_PRIORITY: ColumnElement[int] = literal_column("CAST(32767 AS SMALLINT)")
#: A literal LIMIT 1: a bound one leaves a generic plan guessing how many rows a step fetches.
ONE: ColumnElement[int] = literal_column("1")


def _due_head(run_at: ColumnElement[Any]) -> ColumnElement[bool]:
    # Whether the first job of a priority (of a key) is due: its index entries are in run_at
    # order, so if the first is not due none is.
    return run_at <= func.now()


def _unkeyed_in(queue: ColumnElement[str]) -> tuple[ColumnElement[bool], ...]:
    # The claim index's predicate first, then its leading column.
    return (job.c.state == PENDING, job.c.concurrency_key.is_(None), job.c.queue == queue)


def _priorities(
    queue: ColumnElement[str],
    first_where: tuple[ColumnElement[bool], ...] = (),
    *,
    nesting: bool = False,
) -> Any:
    """The distinct priorities of ``queue``'s pending unkeyed jobs, ascending, each with the
    ``run_at`` of its first job (``due`` when that has passed), as a recursive CTE.

    A loose index scan of ``sqla_jobs_job_claim_idx``: each step is one descent to the first
    entry past the previous priority, so the cost is one probe per priority present, whatever
    the number of jobs behind each (PostgreSQL before 18 cannot skip through an index itself).
    """
    unkeyed = _unkeyed_in(queue)
    columns = (job.c.priority, job.c.run_at, _due_head(job.c.run_at).label("due"))
    order = (job.c.priority, job.c.run_at, job.c.id)
    # correlate_except: ``queue`` may be a column of an enclosing query (the poll's queue list).
    first = (
        select(*columns)
        .where(*unkeyed, *first_where)
        .order_by(*order)
        .limit(ONE)
        .correlate_except(job)
    )
    priorities = first.cte("priorities", recursive=True, nesting=nesting)
    after = (
        select(*columns)
        .where(*unkeyed, job.c.priority > priorities.c.priority)
        .order_by(*order)
        .limit(ONE)
        .correlate_except(job)
        .lateral("after")
    )
    return priorities.union_all(select(*after.c).select_from(priorities).join(after, true()))


def _claim(
    due: tuple[ColumnElement[bool], ...], meta: bool = False, timed: bool = False
) -> Select[Any]:
    # For each priority in ascending order, an index range scan of (queue, priority, run_at <=
    # now()): it stops at the priority's first job not due yet, so jobs scheduled for later are
    # never read. A plain ORDER BY priority, run_at, id over the whole queue instead walks every
    # scheduled entry whenever fewer jobs are due than the limit asks for (12,000 buffers with
    # 2M jobs a day ahead, on every idle worker's claim). The nested loop keeps the CTE's
    # priority order and the outer LIMIT stops pulling, so no row past the limit is locked.
    queue = bindparam("queue", type_=Text)
    # Nested in the claim's subquery: the statement still starts with its UPDATE's CTE.
    priorities = _priorities(queue, (_not_paused(),), nesting=True)
    limit = bindparam("limit", type_=BigInteger)
    under = (
        select(job.c.id)
        .where(
            *_unkeyed_in(queue),
            job.c.priority == priorities.c.priority,
            *due,
            # A filter on the same index scan: stepping over the few crashed rows at the head of
            # the line costs nothing and needs no index of its own.
            _crash_rule(),
        )
        .order_by(job.c.run_at, job.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .lateral("under")
    )
    # ARRAY(subquery) is an InitPlan: the selection runs once, and the UPDATE fetches exactly the
    # rows the LIMIT kept by primary key. A join against a CTE instead left the join to the
    # planner, which (the CTE's row count being a guess) hashed it against a scan of the whole
    # table: a claim of 135 jobs from 20,000 took 3.1 ms instead of 0.9.
    picked = select(under.c.id).select_from(priorities).join(under, true()).limit(limit)
    return _mark_claimed(
        update(job).where(job.c.id == func.any(func.array(picked.scalar_subquery()))),
        meta,
        timed,
    )


def _not_paused(queue: ColumnElement[str] | None = None) -> ColumnElement[bool]:
    # The queue is not paused: uncorrelated with the job rows, so PostgreSQL runs it once per
    # claim (an InitPlan, one primary-key probe of a tiny table) and a paused queue's claim reads
    # no job at all. A pause therefore holds from the next claim of every worker on.
    paused: Select[Any] = select(literal_column("1")).where(
        queue_state.c.queue == (bindparam("queue", type_=Text) if queue is None else queue),
        queue_state.c.paused_at.is_not(None),
    )
    return ~paused.exists()


def _crash_rule() -> ColumnElement[bool]:
    # Which jobs that crashed a worker before a claim may take. A job on its last crash life
    # (one more crash makes it dead) runs only in a process holding no other crashed job, so a
    # poison job cannot take a healthy job dead with it: ``last_life_ok`` is true only for a
    # worker that holds no crashed job, ``crashed_ok`` only for one that holds no last-life job.
    # Other crashed jobs flow freely (a crash of their process costs each one crash life).
    return or_(
        job.c.crashes == 0,
        and_(bindparam("crashed_ok", True, type_=Boolean), job.c.crashes + 1 < job.c.max_crashes),
        bindparam("last_life_ok", True, type_=Boolean),
    )


def _mark_claimed(stmt: Update, meta: bool = False, timed: bool = False) -> Select[Any]:
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
    selected: list[ColumnElement[Any]] = [claimed.c[c.name] for c in columns]
    if timed:
        # Last, after the meta: a row's due_at is its last element (context.due_at).
        selected.append(_due_at(claimed))
    return select(*selected).order_by(claimed.c.priority, claimed.c.run_at, claimed.c.id)


def _due_at(claimed: Any) -> ColumnElement[float]:
    # When the job became due, on the worker's time.monotonic() clock: ``monotonic`` is that
    # clock when the worker sent the claim, and the job had then been due for now() - run_at by
    # the database's clock (the clock run_at is on), so a worker whose own clock is off still
    # measures its pickup delay right. One float per row, from the run_at the UPDATE returns
    # anyway; still 0.15-0.25 us of the worker's CPU per job, so only a worker with metrics
    # claims with it.
    age = func.date_part(literal_column("'epoch'"), func.now() - claimed.c.run_at)
    return (bindparam("monotonic", 0.0, type_=Float) - age).label("due_at")


#: First key of the two-key advisory locks sqla-jobs takes (hashtext('sqla_jobs')): a namespace so
#: our locks cannot collide with the application's single-key advisory locks.
ADVISORY_NAMESPACE = -1196525586


def _per_key_rank(rows: Any) -> ColumnElement[int]:
    # A job's place in its key's line: priority, then run_at, then id (per-key FIFO).
    return (
        func.row_number()
        .over(
            partition_by=rows.c.concurrency_key,
            order_by=(rows.c.priority, rows.c.run_at, rows.c.id),
        )
        .label("rank")
    )


def _keyed_in(queue: ColumnElement[str]) -> tuple[ColumnElement[bool], ...]:
    # The keyed index's predicate first, then its leading column.
    return (job.c.state == PENDING, job.c.concurrency_key.is_not(None), job.c.queue == queue)


#: Whether the first job of a (key, priority) is due (:func:`_due_head` for a worker).
HeadTest = Callable[[ColumnElement[Any]], ColumnElement[bool]]


def _key_heads(
    queue: ColumnElement[str],
    filters: tuple[ColumnElement[bool], ...],
    is_due: HeadTest,
    first_where: tuple[ColumnElement[bool], ...] = (),
    nesting: bool = False,
) -> Any:
    """Each key's head among ``queue``'s pending keyed jobs (those ``filters`` keep), in key order,
    as a recursive CTE of (concurrency_key, priority, run_at, id, due); ``due`` is ``is_due`` of
    the row's run_at, and a key without a due job ends with rows whose ``due`` is false.

    A loose index scan of ``sqla_jobs_job_keyed_idx`` (queue, key, priority, run_at, id): each
    step is one descent to the first entry past the previous (key, priority). A due entry is its
    key's head (the key's earlier priorities had none due), and the next step jumps past the
    key. The cost follows the keys and their priorities, never the jobs behind them.
    """
    key, priority = job.c.concurrency_key, job.c.priority
    order = (key, priority, job.c.run_at, job.c.id)
    columns = (key, priority, job.c.run_at, job.c.id, is_due(job.c.run_at).label("due"))
    first = (
        select(*columns)
        .where(*_keyed_in(queue), *filters, *first_where)
        .order_by(*order)
        .limit(ONE)
        .correlate_except(job)
    )
    heads = first.cte("heads", recursive=True, nesting=nesting)
    past = case((heads.c.due, LAST_PRIORITY), else_=heads.c.priority)
    after = (
        select(*columns)
        .where(
            *_keyed_in(queue),
            *filters,
            tuple_(key, priority) > tuple_(heads.c.concurrency_key, past),
        )
        .order_by(*order)
        .limit(ONE)
        .correlate_except(job)
        .lateral("after")
    )
    return heads.union_all(select(*after.c).select_from(heads).join(after, true()))


def lock_keys() -> Select[tuple[str]]:
    """Step 1 of the keyed claim: try-lock the concurrency keys of up to ``scan`` due keyed jobs of
    ``queue``, in claim order; returns the keys this transaction now holds.

    Takes transaction-scoped advisory locks (``pg_try_advisory_xact_lock``, never waiting): a key
    another worker is claiming right now is skipped, not waited for. The locks are released when
    the claim transaction commits. Served by ``sqla_jobs_job_keyed_idx``: a loose index scan
    (:func:`_key_heads`) reads each key's head and nothing behind it, one descent per key (and per
    priority of a key before its first due one); the heads are then sorted in claim order.
    """
    return _lock_keys((), _due_head)


def _lock_keys(filters: tuple[ColumnElement[bool], ...], is_due: HeadTest) -> Select[tuple[str]]:
    queue = bindparam("queue", type_=Text)
    heads = _key_heads(queue, filters, is_due, (_not_paused(),))
    # Lock only the keys we may claim this round (a fence again): a filter evaluated over every
    # head would lock keys we then leave, starving other workers of them for no reason.
    candidates = (
        select(heads.c.concurrency_key)
        .where(heads.c.due)
        .order_by(heads.c.priority, heads.c.run_at, heads.c.id)
        .limit(bindparam("scan", type_=BigInteger))
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    return select(candidates.c.concurrency_key).where(
        func.pg_try_advisory_xact_lock(
            literal_column(str(ADVISORY_NAMESPACE)), func.hashtext(candidates.c.concurrency_key)
        )
    )


def claim_keyed() -> Select[Any]:
    """Step 2 of the keyed claim, in the same transaction as :func:`lock_keys` and after it: claim
    up to ``limit`` due jobs of ``queue`` whose key is in ``keys``, at most
    ``concurrency_limit - running`` per key, in per-key order.

    Exact under concurrency: the transaction holds the keys' advisory locks, so no other worker is
    claiming them, and this statement's snapshot is taken after the locks were granted, so it sees
    every claim committed by their previous holders. Reads, per key, at most what the key can
    take under the limit of its first pending job, for each priority it has (an index range scan
    of ``sqla_jobs_job_keyed_idx`` that stops at the first job not due). Returns
    :data:`CLAIMED_COLUMNS`.
    """
    return _claim_keyed(_due_now())


def claim_keyed_with_meta() -> Select[Any]:
    """:func:`claim_keyed`, returning each job's ``meta`` too, after :data:`CLAIMED_COLUMNS` (see
    :func:`claim_with_meta`)."""
    return _claim_keyed(_due_now(), meta=True)


def claim_keyed_with_due_at() -> Select[Any]:
    """:func:`claim_keyed`, returning each job's ``due_at`` too, as the last column (see
    :func:`claim_with_due_at`)."""
    return _claim_keyed(_due_now(), timed=True)


def claim_keyed_with_meta_and_due_at() -> Select[Any]:
    """:func:`claim_keyed_with_meta` with ``due_at`` as the last column."""
    return _claim_keyed(_due_now(), meta=True, timed=True)


def _claim_keyed(
    due: tuple[ColumnElement[bool], ...], meta: bool = False, timed: bool = False
) -> Select[Any]:
    keys = bindparam("keys", type_=ARRAY(Text))
    queue = bindparam("queue", type_=Text)
    limit = bindparam("limit", type_=BigInteger)
    key, priority = job.c.concurrency_key, job.c.priority
    running = (
        select(key, func.count().label("n"))
        .where(job.c.state == RUNNING, key == func.any(keys))
        .group_by(key)
        .cte("running")
        .prefix_with("MATERIALIZED")
    )
    # Each key's line, one row per priority it has (a loose index scan, as in _key_heads), with
    # the room the key has left: its first pending job's limit (a key's jobs share one) less its
    # running jobs, and never more than the claim's limit.
    wanted = func.unnest(keys).table_valued("key").render_derived(name="wanted")
    first = (
        select(key, priority, job.c.concurrency_limit)
        .where(*_keyed_in(queue), key == wanted.c.key, _not_paused())
        .order_by(priority, job.c.run_at, job.c.id)
        .limit(ONE)
        .lateral("first")
    )
    room = func.least(limit, first.c.concurrency_limit - func.coalesce(running.c.n, 0))
    lines = (
        select(first.c.concurrency_key, first.c.priority, room.label("room"))
        .select_from(wanted)
        .join(first, true())
        .outerjoin(running, running.c.concurrency_key == first.c.concurrency_key)
        .where(room > 0)
        .cte("lines", recursive=True)
    )
    after = (
        select(key, priority)
        .where(*_keyed_in(queue), key == lines.c.concurrency_key, priority > lines.c.priority)
        .order_by(priority, job.c.run_at, job.c.id)
        .limit(ONE)
        .lateral("after")
    )
    lines = lines.union_all(
        select(after.c.concurrency_key, after.c.priority, lines.c.room)
        .select_from(lines)
        .join(after, true())
    )
    under = (
        select(job.c.id, key, job.c.concurrency_limit, priority, job.c.run_at)
        .where(
            *_keyed_in(queue),
            key == lines.c.concurrency_key,
            priority == lines.c.priority,
            *due,
            _crash_rule(),
        )
        .order_by(job.c.run_at, job.c.id)
        .limit(lines.c.room)
        .lateral("under")
    )
    ranked = (
        select(*under.c, _per_key_rank(under))
        .select_from(lines)
        .join(under, true())
        .cte("ranked")
        .prefix_with("MATERIALIZED")
    )
    # Each row's own limit still caps its rank, as it always did.
    picked = (
        select(ranked.c.id)
        .select_from(
            ranked.outerjoin(running, running.c.concurrency_key == ranked.c.concurrency_key)
        )
        .where(ranked.c.rank <= ranked.c.concurrency_limit - func.coalesce(running.c.n, 0))
        .order_by(ranked.c.priority, ranked.c.run_at, ranked.c.id)
        .limit(limit)
    )
    # By primary key from an InitPlan's array, as in claim(). state is re-checked on the latest
    # row version by the UPDATE itself (READ COMMITTED).
    return _mark_claimed(
        update(job).where(
            job.c.id == func.any(func.array(picked.scalar_subquery())), job.c.state == PENDING
        ),
        meta,
        timed,
    )


def claimable_queues() -> Select[tuple[str]]:
    """Which of ``queues`` have a job a claim could take now: the idle poll of a worker serving
    several queues, one statement for all of them; its claims then go only to those queues.

    A queue is listed when it is not paused and it has a due unkeyed job, or (with ``keyed``) a
    due keyed job, whether or not its key has room (the keyed claim decides). Locks nothing;
    returns the queues in the order given. Loose index scans of ``sqla_jobs_job_claim_idx`` and
    ``sqla_jobs_job_keyed_idx`` (:func:`_priorities`, :func:`_key_heads`) that stop at the first
    due job: per queue with nothing due, one descent per priority (and per key of its keyed
    jobs), however many jobs are scheduled for later.
    """
    queues = bindparam("queues", type_=ARRAY(Text))
    wanted = func.unnest(queues).table_valued("queue", with_ordinality="n").render_derived("wanted")
    queue = wanted.c.queue
    unkeyed = _priorities(queue, nesting=True)
    keyed = _key_heads(queue, (), _due_head, nesting=True)
    return (
        select(queue)
        .where(
            _not_paused(queue),
            or_(
                select(literal_column("1")).select_from(unkeyed).where(unkeyed.c.due).exists(),
                and_(
                    bindparam("keyed", type_=Boolean),
                    select(literal_column("1")).select_from(keyed).where(keyed.c.due).exists(),
                ),
            ),
        )
        .order_by(wanted.c.n)
    )


# -- sqla_jobs.testing: the worker's claims, limited to the jobs a test wrote ---------------------

#: The row was written (inserted, or last updated) by the current transaction or one of its
#: savepoints. Its ``xmin`` is then one of this transaction's xids, which ``pg_xact_status`` alone
#: reports ``in progress`` for a row we can see (another transaction's uncommitted rows are
#: invisible). Comparing ``xmin`` with ``pg_current_xact_id()`` instead would miss every row
#: written in a savepoint, which has an xid of its own: a Session joined with
#: ``join_transaction_mode="create_savepoint"`` writes nothing else. ``xmin`` is 32 bits and
#: ``pg_xact_status`` takes an ``xid8``: the xid is widened to the one nearest this transaction's
#: own (within 2^31 of it, as every unfrozen xid is; not the snapshot's ``xmax``, which our own
#: newest xids may have passed). Without an xid of its own the transaction wrote nothing: NULL.
#: Only a row frozen after 2^31 newer transactions could widen wrongly (to an error).
WRITTEN_HERE: ColumnElement[bool] = literal_column(
    "pg_xact_status((pg_current_xact_id_if_assigned()::text::bigint"
    " + (((xmin::text::bigint - pg_current_xact_id_if_assigned()::text::bigint)"
    " + 2147483648) & 4294967295) - 2147483648)::text::xid8) = 'in progress'",
    Boolean,
)


def _this_test() -> ColumnElement[bool]:
    # Every job when ``all_jobs``, else only this transaction's.
    return or_(bindparam("all_jobs", False, type_=Boolean), WRITTEN_HERE)


def _due_for_testing() -> tuple[ColumnElement[bool], ...]:
    # Due by now() + ``ahead_us`` microseconds (time moved forward without sleeping), or at any
    # time with ``delayed``; the outcomes still compute run_at from the real now().
    return (
        or_(
            bindparam("delayed", False, type_=Boolean),
            job.c.run_at
            <= func.now() + bindparam("ahead_us", 0, type_=BigInteger) * ONE_MICROSECOND,
        ),
        _this_test(),
    )


def claim_for_testing() -> Select[Any]:
    """:func:`claim` as ``sqla_jobs.testing`` runs it, inside a test's transaction: only the jobs
    that transaction wrote (:data:`WRITTEN_HERE`) unless ``all_jobs``, due by ``now()`` plus
    ``ahead_us`` microseconds (any ``run_at`` with ``delayed``). Locks and returns what
    :func:`claim` does; not for workers (``WRITTEN_HERE`` is a filter on every pending row)."""
    return _claim(_due_for_testing())


def lock_keys_for_testing() -> Select[tuple[str]]:
    """:func:`lock_keys` with :func:`claim_for_testing`'s selection (``all_jobs``, ``ahead_us``,
    ``delayed``)."""
    # The selection is a filter on every step (not an index bound): a step then lands on the
    # first selected entry of a key, its head. Fine for a test's few rows.
    return _lock_keys(_due_for_testing(), lambda _: true())


def claim_keyed_for_testing() -> Select[Any]:
    """:func:`claim_keyed` with :func:`claim_for_testing`'s selection (``all_jobs``,
    ``ahead_us``, ``delayed``): the concurrency limits hold as they do for a worker."""
    return _claim_keyed(_due_for_testing())


def find_pending_for_testing() -> Select[Job]:
    """The pending jobs as ORM ``Job`` objects, oldest first (by id), of kind ``kind`` unless
    ``any_kind``, and only those the current transaction wrote unless ``all_jobs``. Locks
    nothing; a test's read, a scan of the pending rows."""
    return (
        select(Job)
        .where(
            job.c.state == PENDING,
            or_(
                bindparam("any_kind", True, type_=Boolean),
                job.c.kind == bindparam("kind", None, type_=Text),
            ),
            _this_test(),
        )
        .order_by(job.c.id)
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


def _claimed_by() -> ColumnElement[bool]:
    # The jobs ``ids`` of the one claim ``token``: exact pairs (every id with that token), and one
    # index scan for the whole array, which a join of (id, token) pairs is not (a descent per
    # pair: 6% of a drain's throughput).
    return and_(
        job.c.id == func.any(_ids()),
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
            errors=_append_error(
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


def _append_error(
    error_class: ColumnElement[Any], message: ColumnElement[Any], trace: ColumnElement[Any]
) -> ColumnElement[Any]:
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


def heartbeat() -> AnyUpdate:
    """Extend the leases of the (``ids``, ``tokens``) pairs still held to ``now() + lease``;
    returns the ids whose lease was extended, and whether an operator asked to cancel each (the
    floor under the cancel NOTIFY).

    Never waits for a row lock: a row someone else has locked (an operator's ``SELECT ... FOR
    UPDATE``, the application's own ``with_for_update()``) is skipped, so it delays at most its
    own renewal. A missing id is therefore lost or locked: :func:`held_leases` tells which.
    Touches only ``lease_expires_at``, which no index covers, so the update can be HOT.
    """
    held = _held()
    mine = (
        select(job.c.id)
        .where(_fenced(held))
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
    held = _held()
    return select(job.c.id).where(_fenced(held))


def release() -> AnyUpdate:
    """Give back jobs this worker claimed but will not finish (graceful shutdown).

    Back to ``pending`` at their old place in line, lease cleared, and the claim's attempt undone:
    a release is neither a failure nor a crash. With ``interrupted`` (the handlers had started)
    ``interruptions`` counts it, so the next run knows it is a re-run. A job whose cancel was
    requested is ``cancelled`` instead. Fenced on the (``ids``, ``tokens``) pairs; returns the
    released ids.
    """
    held = _held()
    interrupted = bindparam("interrupted", False, type_=Boolean)
    cancelled = job.c.cancel_requested_at.is_not(None)
    return (
        update(job)
        .where(_fenced(held))
        .values(
            state=case((cancelled, CANCELLED), else_=PENDING),
            finished_at=case((cancelled, func.now()), else_=null()),
            attempts=func.greatest(job.c.attempts - 1, 0),
            interruptions=job.c.interruptions + case((interrupted, 1), else_=0),
            lease_token=null(),
            lease_expires_at=null(),
            locked_by=null(),
        )
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
            errors=_append_error(literal_column("'LeaseExpired'"), message, null()),
            lease_token=null(),
            lease_expires_at=null(),
            locked_by=null(),
        )
        .returning(
            job.c.id, job.c.kind, job.c.state, job.c.crashes, expired.c.locked_by, job.c.queue
        )
    )


def stats_by_queue() -> Select[tuple[str, str, int, object]]:
    """Count jobs per queue and state, with the age of the oldest *due* pending job (the true
    queue latency). A full scan of the (small, history-free) table; no locks."""
    due_age = func.max(func.now() - job.c.run_at).filter(
        and_(job.c.state == PENDING, job.c.run_at <= func.now())
    )
    return (
        select(job.c.queue, job.c.state, func.count().label("jobs"), due_age.label("oldest_due"))
        .group_by(job.c.queue, job.c.state)
        .order_by(job.c.queue, job.c.state)
    )


def table_health() -> Select[tuple[object, ...]]:
    """Dead tuples, live tuples, last (auto)vacuum and size of the queue table in ``schema``
    (NULL: the first schema of the search_path), from ``pg_stat_user_tables``."""
    return select(
        text(
            "n_live_tup, n_dead_tup, last_autovacuum, last_vacuum, autovacuum_count, "
            "pg_total_relation_size(relid) AS total_bytes "
            "FROM pg_stat_user_tables "
            "WHERE relname = 'sqla_jobs_job' "
            "AND schemaname = coalesce(CAST(:schema AS text), current_schema())"
        )
    )


def oldest_transaction() -> Select[tuple[object, ...]]:
    """The oldest open transaction holding back this database's xmin horizon (its age, pid, state,
    and the first 100 characters of its query): what stops vacuum from removing the queue's dead
    tuples.

    A transaction holds the horizon back through its snapshot (``backend_xmin``) or through its own
    transaction id (``backend_xid``): a session idle in a transaction that wrote something holds
    no snapshot, yet pins every row version that died after it began. Transactions in other
    databases do not hold back this database's tables and are left out; backends of no database
    (a walsender with ``hot_standby_feedback``) are kept.
    """
    return select(
        text(
            "now() - xact_start AS age, pid, state, left(query, 100) AS query "
            "FROM pg_stat_activity "
            "WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) "
            "AND (datname = current_database() OR datname IS NULL) "
            "AND pid <> pg_backend_pid() "
            "ORDER BY xact_start LIMIT 1"
        )
    )


def find_job_tables() -> Select[tuple[object, ...]]:
    """Every queue table in the database, one row per schema holding a ``sqla_jobs_job``: the
    schema, whether it is the table the queue's statements reach (``:schema``, or with NULL the one
    an unqualified name resolves to through the search_path), and its column names. The wanted table
    comes first, then the others by schema.

    Reads the catalog only (``pg_class``, ``pg_namespace``, ``pg_attribute``): no lock on the table
    and no privilege on it or its schema needed, so it runs as any role before anything else does.
    """
    return select(
        text(
            "n.nspname AS schema, "
            "CASE WHEN CAST(:schema AS text) IS NULL "
            "THEN (c.oid = to_regclass('sqla_jobs_job')) IS TRUE "
            "ELSE n.nspname = CAST(:schema AS text) END AS wanted, "
            "ARRAY(SELECT CAST(a.attname AS text) FROM pg_attribute AS a "
            "WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum) AS columns "
            "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE c.relname = 'sqla_jobs_job' AND c.relkind IN ('r', 'p') "
            "ORDER BY wanted DESC, n.nspname"
        )
    )


# -- operations: what an operator does to jobs and queues (sqla_jobs.operations.jobs) --------------------------


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
        .where(job.c.id == func.any(_ids()))
        .order_by(job.c.id)
        .with_for_update()
    )


def find_jobs() -> Select[Any]:
    """Up to ``limit`` jobs in one of ``states`` (a text array), of ``queue`` and ``kind`` when
    given (NULL: any), oldest id first, locked as :func:`lock_jobs` locks them. For an operation
    by filter (``retry --all-dead``, ``cancel --queue``). Served by the claim, running and
    finished indexes' leading columns or a scan: operations are rare."""
    kind = bindparam("kind", type_=Text)
    queue = bindparam("queue", type_=Text)
    return (
        select(*_OPERATED_COLUMNS)
        .where(
            job.c.state == func.any(bindparam("states", type_=ARRAY(Text))),
            or_(queue.is_(None), job.c.queue == queue),
            or_(kind.is_(None), job.c.kind == kind),
        )
        .order_by(job.c.id)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update()
    )


def find_jobs_among() -> Select[Any]:
    """:func:`find_jobs` among the jobs ``ids`` (a bigint array: what the application's own query
    of job ids returned, for an operation given a SELECT), locked as :func:`lock_jobs` locks them.
    An id no job has is no error: a filter finds what is there. Primary key."""
    return find_jobs().where(job.c.id == func.any(_ids()))


def retry_jobs() -> AnyUpdate:
    """Run the dead, cancelled or pending jobs ``ids`` as soon as possible: ``pending`` at
    ``now()`` with both budgets whole again (``attempts``, ``crashes`` and ``interruptions`` at
    0), the cancel request and ``finished_at`` cleared; ``errors`` and ``last_error`` are kept, for
    the record. Running and completed jobs are left alone. Returns the ids and their queues."""
    return (
        update(job)
        .where(
            job.c.id == func.any(_ids()),
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
    """Cancel the pending jobs ``ids``: ``cancelled``, never to run. Returns their ids."""
    return (
        update(job)
        .where(job.c.id == func.any(_ids()), job.c.state == PENDING)
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
            job.c.id == func.any(_ids()),
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
        .where(job.c.id == func.any(_ids()), job.c.state == RUNNING)
        .values(cancel_requested_at=func.coalesce(job.c.cancel_requested_at, func.now()))
        .returning(job.c.id)
    )


def set_queue_paused() -> AnyInsert:
    """Pause (``paused`` true) or resume queue ``queue``: one row per queue an operator touched,
    upserted; a pause keeps its first time. Returns whether it is paused now and since when."""
    paused = bindparam("paused", type_=Boolean)
    stmt = pg_insert(queue_state).values(
        queue=bindparam("queue", type_=Text),
        paused_at=case((paused, func.now()), else_=null()),
    )
    return stmt.on_conflict_do_update(
        index_elements=[queue_state.c.queue],
        set_={
            "paused_at": case(
                (paused, func.coalesce(queue_state.c.paused_at, func.now())), else_=null()
            ),
            "updated_at": func.now(),
        },
    ).returning(queue_state.c.paused_at)


# -- periodic schedules (sqla_jobs.periodic.scheduler, sqla-jobs schedules) ---------------------------------


def register_schedules() -> AnyInsert:
    """Add the rows of schedules not yet in ``sqla_jobs_schedule``: ``names``, ``kinds`` and
    ``specs`` are parallel text arrays. Rows already there are left alone (``ON CONFLICT DO
    NOTHING``: no lock on them, so a scheduler starting never waits behind a tick's
    transaction). Returns the names inserted."""
    rows = select(
        func.unnest(bindparam("names", type_=ARRAY(Text))).label("name"),
        func.unnest(bindparam("kinds", type_=ARRAY(Text))).label("kind"),
        func.unnest(bindparam("specs", type_=ARRAY(Text))).label("spec"),
    )
    return (
        pg_insert(schedule)
        .from_select(["name", "kind", "spec"], rows)
        .on_conflict_do_nothing(index_elements=[schedule.c.name])
        .returning(schedule.c.name)
    )


def read_schedules() -> Select[Any]:
    """The scheduling state of the schedules named in ``names`` (a text array): ``spec``,
    ``last_tick_at``, ``paused_at``, and the database clock (``clock_timestamp()``, the time
    every tick is planned by). No locks; primary key probes."""
    return select(
        schedule.c.name,
        schedule.c.spec,
        schedule.c.last_tick_at,
        schedule.c.paused_at,
        func.clock_timestamp().label("now"),
    ).where(schedule.c.name == func.any(bindparam("names", type_=ARRAY(Text))))


def advance_schedule() -> AnyUpdate:
    """Compare-and-set: move schedule ``schedule_name`` from last tick ``prev`` (NULL: none yet) to
    ``tick``, writing ``next_tick``, ``schedule_spec`` and ``schedule_kind``, unless it is paused. The row is locked
    ``FOR UPDATE SKIP LOCKED``: a scheduler never waits for another one's tick, and of two that
    race for the same ``prev`` only one gets the row back (the other's re-check, under READ
    COMMITTED, sees the new ``last_tick_at``). Returns the name when it advanced, nothing
    otherwise. Run in the transaction that enqueues the tick's jobs, so the two commit together."""
    prev = bindparam("prev", type_=schedule.c.last_tick_at.type)
    name = bindparam("schedule_name", type_=Text)
    locked = (
        select(schedule.c.name)
        .where(
            schedule.c.name == name,
            schedule.c.last_tick_at.is_not_distinct_from(prev),
            schedule.c.paused_at.is_(None),
        )
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        update(schedule)
        .where(schedule.c.name == locked)
        .values(
            last_tick_at=bindparam("tick", type_=schedule.c.last_tick_at.type),
            next_tick_at=bindparam("next_tick", type_=schedule.c.next_tick_at.type),
            spec=bindparam("schedule_spec", type_=Text),
            kind=bindparam("schedule_kind", type_=Text),
            seen_at=func.now(),
            updated_at=func.now(),
        )
        .returning(schedule.c.name)
    )


def record_schedule_job() -> AnyUpdate:
    """Set the last job enqueued by schedule ``schedule_name`` to ``last_job`` (in the transaction that
    advanced it, whose lock it already holds)."""
    return (
        update(schedule)
        .where(schedule.c.name == bindparam("schedule_name", type_=Text))
        .values(last_job_id=bindparam("last_job", type_=BigInteger))
        .returning(schedule.c.name)
    )


def set_schedule_paused() -> AnyInsert:
    """Pause (``paused`` true) or resume schedule ``schedule_name`` (of ``schedule_kind``, defined as ``schedule_spec``),
    adding its row if no scheduler has yet. A pause keeps its first time. A resume of a paused
    schedule moves its last tick up to now, so the ticks that passed while it was held are
    skipped, not caught up; resuming one that is not paused changes nothing. Waits for a tick's
    transaction on that row (milliseconds). Returns ``paused_at`` and ``last_tick_at``."""
    paused = bindparam("paused", type_=Boolean)
    stmt = pg_insert(schedule).values(
        name=bindparam("schedule_name", type_=Text),
        kind=bindparam("schedule_kind", type_=Text),
        spec=bindparam("schedule_spec", type_=Text),
        paused_at=case((paused, func.now()), else_=null()),
        last_tick_at=case((paused, null()), else_=func.now()),
    )
    return stmt.on_conflict_do_update(
        index_elements=[schedule.c.name],
        set_={
            "paused_at": case(
                (paused, func.coalesce(schedule.c.paused_at, func.now())), else_=null()
            ),
            "last_tick_at": case(
                (or_(paused, schedule.c.paused_at.is_(None)), schedule.c.last_tick_at),
                else_=func.greatest(schedule.c.last_tick_at, func.now()),
            ),
            "updated_at": func.now(),
        },
    ).returning(schedule.c.paused_at, schedule.c.last_tick_at)


def scheduler_privileges() -> Select[Any]:
    """Whether the current role may run the scheduler: ``enqueue`` (INSERT on the job table named
    ``job_table``) and ``schedules`` (SELECT, INSERT, UPDATE on ``schedule_table``). The names
    are bound, schema-qualified as :func:`job_table_name` renders them. Reads the catalog only."""
    schedule_table = bindparam("schedule_table", type_=Text)
    # A list of privileges is true when ANY of them is held: each is asked for on its own.
    return select(
        func.has_table_privilege(bindparam("job_table", type_=Text), "INSERT").label("enqueue"),
        and_(
            *(func.has_table_privilege(schedule_table, p) for p in ("SELECT", "INSERT", "UPDATE"))
        ).label("schedules"),
    )


def completion_privileges() -> Select[Any]:
    """Whether the current role may complete a job in its own transaction: ``complete`` (SELECT
    and DELETE on the job table bound as ``job_table``) and ``history`` (INSERT on the table
    bound as ``history_table``). Names as :func:`job_table_name` renders them; catalog only."""
    job_table = bindparam("job_table", type_=Text)
    return select(
        and_(
            func.has_table_privilege(job_table, "SELECT"),
            func.has_table_privilege(job_table, "DELETE"),
        ).label("complete"),
        func.has_table_privilege(bindparam("history_table", type_=Text), "INSERT").label("history"),
    )


def blocking_foreign_keys() -> Select[Any]:
    """How many foreign keys of the application's point at the job table (bound as
    ``job_table``, text, as :func:`job_table_name` renders it) with an action that refuses the
    delete of a referenced row (``NO ACTION``, ``RESTRICT``). Reads the catalog only."""
    constraint = sa_table(
        "pg_constraint",
        column("contype"),
        column("confrelid"),
        column("confdeltype"),
        schema="pg_catalog",
    )
    return (
        select(func.count())
        .select_from(constraint)
        .where(
            constraint.c.contype == "f",
            constraint.c.confrelid == cast(bindparam("job_table", type_=Text), REGCLASS),
            constraint.c.confdeltype.in_(["a", "r"]),
        )
    )


def deferred_job_triggers() -> Select[Any]:
    """How many triggers on the job table (bound as ``job_table``, text, as
    :func:`job_table_name` renders it) fire only at commit (``INITIALLY DEFERRED``): those of the
    application's deferrable foreign keys to it (Django makes them so), and constraint triggers of
    its own. A worker whose claim connection finds any runs :data:`IMMEDIATE_CONSTRAINTS` first
    in each pipeline that writes outcomes. Reads the catalog only."""
    trigger = TableClause(
        "pg_trigger", column("tgrelid"), column("tginitdeferred"), schema="pg_catalog"
    )
    return (
        select(func.count())
        .select_from(trigger)
        .where(
            trigger.c.tgrelid == cast(bindparam("job_table", type_=Text), REGCLASS),
            trigger.c.tginitdeferred.is_(true()),
        )
    )


#: Checks what the rest of the transaction does at each statement's end, deferred constraints
#: included: a violation found at a pipeline's implicit commit leaves psycopg's pipeline unusable
#: (the connection lost, the outcomes retried forever), one found at the statement's end is that
#: statement's error, which the worker handles (a completion kept as ``completed``).
IMMEDIATE_CONSTRAINTS = "SET CONSTRAINTS ALL IMMEDIATE"


def limit_idle_in_transaction() -> Select[tuple[object]]:
    """For the rest of the transaction, let the server end it if its client goes quiet for
    ``timeout`` (text, e.g. ``'10s'``): a scheduler frozen in a tick's transaction then lets go of
    the schedule's row lock instead of holding that schedule back until it thaws."""
    return select(
        func.set_config(
            "idle_in_transaction_session_timeout", bindparam("timeout", type_=Text), true()
        )
    )


def database_clock() -> Select[Any]:
    """The database's ``now()``: what schedule listings compute the next tick from."""
    return select(func.now())


def list_schedules() -> Select[Any]:
    """Every row of ``sqla_jobs_schedule``, by name, with the state of its last job (NULL once
    that job is pruned). No locks; for ``sqla-jobs schedules``."""
    return (
        select(
            schedule.c.name,
            schedule.c.kind,
            schedule.c.spec,
            schedule.c.last_tick_at,
            schedule.c.last_job_id,
            schedule.c.next_tick_at,
            schedule.c.paused_at,
            schedule.c.seen_at,
            job.c.state.label("last_job_state"),
        )
        .select_from(schedule.outerjoin(job, job.c.id == schedule.c.last_job_id))
        .order_by(schedule.c.name)
    )


# -- links: jobs linked to the application's own rows (sqla_jobs.links) ---------------------------

#: What the link builders compile for when given no table: the shape ``sqla_jobs.link_table``
#: builds, a row's key and a job's id (the golden files show the SQL for it).
EXAMPLE_LINK = TableClause(
    "order_jobs", column("order_id", BigInteger), column("job_id", BigInteger)
)


def insert_links(
    link: TableClause = EXAMPLE_LINK,
    key: str = "order_id",
    job_key: str = "job_id",
    schema: str | None = None,
) -> Insert:
    """Link jobs to rows through the application's link table ``link``: one row per pair of the
    parallel arrays ``keys`` (of the ``key`` column's type) and ``ids`` (job ids), ``ON CONFLICT
    DO NOTHING`` (a link made twice is made once), for the jobs the statement's snapshot sees
    (a job already gone is not linked). No lock of its own: the foreign key's check locks each
    job ``FOR KEY SHARE`` (as the job table's owner, so the caller needs no ``UPDATE`` on it),
    which makes a worker's completion of an *existing* job wait for the caller's commit; a job
    enqueued in the same transaction is seen by no worker yet. The job table is named with
    ``schema`` here: a ``schema_translate_map`` would move the application's link table along
    with it. Primary key probes on the job table; the link table's primary key takes the rows.
    """
    jobs = TableClause(job.name, column("id", BigInteger), schema=schema)
    pairs = (
        func.unnest(
            bindparam("keys", type_=ARRAY(link.c[key].type)),
            bindparam("ids", type_=ARRAY(BigInteger)),
        )
        .table_valued("key", "id")
        .render_derived(name="pairs")
    )
    rows = select(pairs.c.key, jobs.c.id).join_from(pairs, jobs, jobs.c.id == pairs.c.id)
    return pg_insert(link).from_select([key, job_key], rows).on_conflict_do_nothing()


#: SAVEPOINT, ROLLBACK TO and RELEASE of the savepoint around links to jobs this enqueue did not
#: insert (a unique job's duplicate): the one job it links may complete meanwhile.
LINK_SAVEPOINT = (
    "SAVEPOINT sqla_jobs_link",
    "ROLLBACK TO SAVEPOINT sqla_jobs_link",
    "RELEASE SAVEPOINT sqla_jobs_link",
)


def find_link_table() -> Select[Any]:
    """The relation named ``link_table`` (text: a name quoted as SQL, schema-qualified or
    resolved through the search_path): its schema, its name, and the columns of its single-column
    foreign keys to the job table ``job_table`` (text, as :func:`job_table_name` renders it). No
    row: no such relation. No column: it is not a link table. For ``sqla-jobs jobs list
    --linked``, which reads such a table only once this has vouched for it. Reads the catalog
    only (no privilege on either table needed)."""
    return select(
        text(
            "n.nspname AS schema, c.relname AS name, "
            "ARRAY(SELECT CAST(a.attname AS text) FROM pg_constraint AS k "
            "JOIN pg_attribute AS a ON a.attrelid = k.conrelid AND a.attnum = k.conkey[1] "
            "WHERE k.conrelid = c.oid AND k.contype = 'f' AND cardinality(k.conkey) = 1 "
            "AND k.confrelid = to_regclass(CAST(:job_table AS text)) "
            "ORDER BY a.attname) AS job_columns "
            "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(CAST(:link_table AS text))"
        )
    )


def list_linked_jobs(
    link: TableClause = EXAMPLE_LINK, key: str = "order_id", job_key: str = "job_id"
) -> Select[Any]:
    """:func:`list_jobs` (same parameters and columns), only the jobs linked through the
    application's link table ``link`` to the rows whose ``key`` column equals ``linked`` (text,
    cast by the server to that column's type: a value that cannot be one is an error before
    anything is read). An EXISTS, so a job linked twice is listed once. No locks; the link
    table's primary key (key first) finds the jobs, the job table's primary key reads them."""
    value = cast(bindparam("linked", type_=Text), link.c[key].type)
    linked = (
        select(link.c[job_key]).where(link.c[job_key] == job.c.id, link.c[key] == value).exists()
    )
    return list_jobs().where(linked)


# -- the CLI's listings ----------------------------------------------------------------------------


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


def list_queue_states() -> Select[Any]:
    """Every queue an operator paused or resumed (``sqla_jobs_queue``): name, ``paused_at``
    (NULL: active) and ``updated_at``, by name. No locks; a scan of a table of a few rows."""
    return select(queue_state.c.queue, queue_state.c.paused_at, queue_state.c.updated_at).order_by(
        queue_state.c.queue
    )


def stats_by_kind() -> Select[tuple[str, str, int, object]]:
    """Count jobs per kind and state, with the age of the oldest *due* pending job of the kind:
    :func:`stats_by_queue` per kind. A full scan of the table; no locks."""
    due_age = func.max(func.now() - job.c.run_at).filter(
        and_(job.c.state == PENDING, job.c.run_at <= func.now())
    )
    return (
        select(job.c.kind, job.c.state, func.count().label("jobs"), due_age.label("oldest_due"))
        .group_by(job.c.kind, job.c.state)
        .order_by(job.c.kind, job.c.state)
    )


# -- retention ----------------------------------------------------------------------------------------

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


# -- metrics: the queue sampler -----------------------------------------------------------------------

#: The name of the sampler's advisory lock (with the schema): one worker samples the queues.
SAMPLE_LOCK_NAME = "sqla_jobs.sample"


def try_lock_sampler() -> Select[tuple[bool]]:
    """Try to become the one queue sampler of the queue table in ``schema_name``: a
    *session-level* advisory lock (:data:`ADVISORY_NAMESPACE`,
    ``hashtext('sqla_jobs.sample:' || schema_name)``), never waited for; true if this session
    holds it now. The sampler keeps it for as long as its connection lives (no transaction, no
    snapshot); the session's end releases it, and another worker's next try takes it."""
    schema = func.coalesce(bindparam("schema_name", type_=Text), literal_column("''"))
    name: ColumnElement[str] = literal_column(f"'{SAMPLE_LOCK_NAME}:'") + schema
    return select(
        func.pg_try_advisory_lock(literal_column(str(ADVISORY_NAMESPACE)), func.hashtext(name))
    )


def sample_queues() -> Any:
    """The queues' depth for the metrics: rows of (queue, state, jobs, oldest due age in seconds).

    ``due`` rows count the pending jobs whose ``run_at`` has passed, with the age of the oldest
    (one row per queue from the unkeyed jobs and one from the keyed jobs: add them up); ``running``,
    ``dead``, ``cancelled`` and ``completed`` rows count those states (no age). Jobs not yet due
    are never read: with millions of jobs scheduled for later, counting them would read every
    one of them at every sample.

    Unkeyed due jobs are found by a loose index scan of ``sqla_jobs_job_claim_idx`` (queue,
    priority, run_at): a recursive CTE steps from one (queue, priority) to the next by one index
    probe each, and under each reads only the index entries already due; the cost is one probe per
    (queue, priority) plus the due jobs, whatever the number of jobs scheduled later. Keyed
    pending jobs are read from ``sqla_jobs_job_keyed_idx`` (all of them: keys are too many to
    step over), running jobs from ``sqla_jobs_job_running_idx`` and finished ones from
    ``sqla_jobs_job_finished_idx``, each partial and holding only its rows. A plain read: no locks.
    """
    unkeyed = (job.c.state == PENDING, job.c.concurrency_key.is_(None))
    order = (job.c.queue, job.c.priority)
    first = select(job.c.queue, job.c.priority).where(*unkeyed).order_by(*order).limit(1)
    heads = first.cte("heads", recursive=True)
    after = (
        select(job.c.queue, job.c.priority)
        .where(
            *unkeyed, tuple_(job.c.queue, job.c.priority) > tuple_(heads.c.queue, heads.c.priority)
        )
        .order_by(*order)
        .limit(1)
        .lateral("next")
    )
    heads = heads.union_all(
        select(after.c.queue, after.c.priority).select_from(heads).join(after, true())
    )
    due_now = job.c.run_at <= func.now()
    under = (
        select(func.count().label("jobs"), func.min(job.c.run_at).label("oldest"))
        .where(*unkeyed, job.c.queue == heads.c.queue, job.c.priority == heads.c.priority, due_now)
        .lateral("under")
    )
    age = func.date_part(literal_column("'epoch'"), func.now() - func.min(under.c.oldest))
    due_unkeyed = (
        select(
            heads.c.queue,
            literal_column("'due'").label("state"),
            cast(func.sum(under.c.jobs), BigInteger).label("jobs"),
            age.label("oldest_due"),
        )
        .select_from(heads)
        .join(under, true())
        .group_by(heads.c.queue)
    )
    keyed_age = func.date_part(
        literal_column("'epoch'"), func.now() - func.min(job.c.run_at).filter(due_now)
    )
    due_keyed = (
        select(job.c.queue, literal_column("'due'"), func.count().filter(due_now), keyed_age)
        .where(job.c.state == PENDING, job.c.concurrency_key.is_not(None))
        .group_by(job.c.queue)
    )
    running = (
        select(job.c.queue, literal_column("'running'"), func.count(), null())
        .where(job.c.state == RUNNING)
        .group_by(job.c.queue)
    )
    finished = (
        select(job.c.queue, job.c.state, func.count(), null())
        .where(job.c.state.in_([COMPLETED, DEAD, CANCELLED]))
        .group_by(job.c.queue, job.c.state)
    )
    return due_unkeyed.union_all(due_keyed, running, finished)


# -- sqla-jobs migrate: its own version table, and the adoption of alembic_version's rows --------

#: The name of the advisory lock ``sqla-jobs migrate`` holds while it migrates one schema.
MIGRATE_LOCK_NAME = "sqla_jobs.migrate"
#: The version table of the schema's Alembic environments other than ours: the application's own,
#: which may hold sqla-jobs' revisions too (the README's recipe), and an earlier sqla-jobs migrate's.
#: Alembic's layout: one row per head.
shared_versions = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), primary_key=True),
)
#: sqla-jobs' own version table, as Alembic creates it.
own_versions = Table(
    VERSION_TABLE,
    MetaData(),
    Column("version_num", String(32), primary_key=True),
)


def lock_migrations() -> Select[tuple[object]]:
    """Wait for the advisory lock of ``sqla-jobs migrate`` on schema ``schema_name``
    (:data:`ADVISORY_NAMESPACE`, ``hashtext('sqla_jobs.migrate:' || schema_name)``) and hold it
    until the transaction ends: two runs at once (a deploy's replicas) migrate one after the
    other, the second finding nothing left to do. Locks nothing else."""
    schema = func.coalesce(bindparam("schema_name", type_=Text), literal_column("''"))
    name: ColumnElement[str] = literal_column(f"'{MIGRATE_LOCK_NAME}:'") + schema
    return select(
        func.pg_advisory_xact_lock(literal_column(str(ADVISORY_NAMESPACE)), func.hashtext(name))
    )


def forget_shared_versions() -> Delete:
    """Delete the rows ``revisions`` (sqla-jobs' own) from ``alembic_version``, leaving every
    other row (the application's revisions) as it is. Locks the rows it deletes; a scan of a table
    of a row per head. Returns nothing."""
    column = shared_versions.c.version_num
    return delete(shared_versions).where(
        column == func.any(bindparam("revisions", type_=ARRAY(Text)))
    )


def drop_shared_version_table() -> DropTable:
    """Drop ``alembic_version``, once :func:`forget_shared_versions` left it empty: an earlier
    ``sqla-jobs migrate`` created it, and an application that needs one again gets it back from
    its own Alembic environment. Takes an ACCESS EXCLUSIVE lock on it until the transaction ends."""
    return DropTable(shared_versions)


def drop_version_table() -> DropTable:
    """Drop sqla-jobs' own version table, after a downgrade to base emptied it (Alembic keeps an
    empty one). Takes an ACCESS EXCLUSIVE lock on it until the transaction ends."""
    return DropTable(own_versions)


# -- the registry of live workers ---------------------------------------------------------------------


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
    """Delete the rows of workers whose ``expires_at`` has passed by the database's clock (killed,
    or away from the database for three of their heartbeats). Returns their names. A scan of a
    table of a few rows; locks the rows it deletes (a worker's beat of its own row waits for it)."""
    return delete(registry).where(registry.c.expires_at < func.now()).returning(registry.c.name)


def list_workers() -> Select[Any]:
    """Every registered worker, oldest first: name, host, pid, queues, concurrency, started_at,
    heartbeat_at, seconds since that heartbeat by the database's clock, and whether the row is
    stale (``expires_at`` passed, not yet pruned). No locks."""
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


# -- the dashboard -----------------------------------------------------------------------------------


def list_jobs_page() -> Select[Any]:
    """:func:`list_jobs` (same parameters and columns) below id ``before``: one page of a listing
    paged by keyset, the next page starting below the last id shown, so a deep page costs what
    the first does and a job enqueued meanwhile never shifts a page (no OFFSET). For the
    dashboard. No locks; the primary key read backwards from ``before``, filtered."""
    return list_jobs().where(job.c.id < bindparam("before", type_=BigInteger))


#: The counted columns of ``sqla_jobs_throughput``, in the order :func:`record_throughput` takes
#: their arrays (``queues``, ``kinds``, then one array per name, each ``<name>s`` but the sums).
THROUGHPUT_COUNTS = (
    "completed",
    "failed",
    "dead",
    "cancelled",
    "snoozed",
    "crashed",
    "runs",
    "run_seconds",
    "pickups",
    "pickup_seconds",
)


def record_throughput() -> Insert:
    """Add a worker's counts to the current minute's rows (by the database's clock), one per
    queue and kind: arrays ``queues``, ``kinds`` and one per :data:`THROUGHPUT_COUNTS` name.
    Rows are written in (queue, kind) order, so that two workers adding to the same minute wait
    for each other in one order, never in a cycle. Locks the rows it writes; a primary-key probe
    each."""
    params = (
        ("queue", Text),
        ("kind", Text),
        *((name, Float if name.endswith("_seconds") else BigInteger) for name in THROUGHPUT_COUNTS),
    )
    rows = (
        func.unnest(*(bindparam(f"{name}_", type_=ARRAY(type_)) for name, type_ in params))
        .table_valued(*(column(name, type_) for name, type_ in params))
        .render_derived(name="t")
    )
    minute = func.date_trunc(literal_column("'minute'"), func.now())
    src = (
        select(minute, *(rows.c[name] for name, _ in params))
        .select_from(rows)
        .order_by(rows.c.queue, rows.c.kind)
    )
    names = ["minute", *(name for name, _ in params)]
    stmt = pg_insert(throughput).from_select(names, src)
    return stmt.on_conflict_do_update(
        index_elements=[throughput.c.minute, throughput.c.queue, throughput.c.kind],
        set_={name: throughput.c[name] + stmt.excluded[name] for name in THROUGHPUT_COUNTS},
    )


def read_throughput() -> Select[Any]:
    """The rows of the last ``minutes`` minutes by the database's clock (the current one
    included), of queue ``queue`` unless it is NULL, oldest first. No locks; served by the
    primary key (``minute`` leads it)."""
    since = func.date_trunc(literal_column("'minute'"), func.now()) - (
        bindparam("minutes", type_=Integer) - literal_column("1")
    ) * literal_column("interval '1 minute'")
    wanted = bindparam("queue", type_=Text)
    return (
        select(throughput)
        .where(
            throughput.c.minute >= since,
            or_(wanted.is_(None), throughput.c.queue == wanted),
        )
        .order_by(throughput.c.minute, throughput.c.queue, throughput.c.kind)
    )


def prune_throughput() -> Delete:
    """Delete the throughput rows of minutes that began more than ``older_than_us``
    microseconds ago. A range of the primary key; no worker writes these old minutes any more,
    so nothing waits on it."""
    return delete(throughput).where(
        throughput.c.minute
        < func.now() - bindparam("older_than_us", type_=BigInteger) * ONE_MICROSECOND
    )
