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
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    ColumnElement,
    Delete,
    Float,
    Insert,
    Interval,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, REGCLASS, UUID
from sqlalchemy.dialects.postgresql import dialect as _pg_dialect
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert, ReturningUpdate
from sqlalchemy.sql.elements import BindParameter, TextClause

from . import _row
from .model import MAX_ERROR_CHARS, Job, JobHistory, QueueState

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
    # Each value bound as its column's type, the payload as text cast to jsonb.
    values: dict[str, Any] = {
        c.name: cast(bindparam(c.name, type_=Text), JSONB)
        if c.json
        else bindparam(c.name, type_=job.c[c.name].type)
        for c in _row.COLUMNS
        if not (lean and c.optional)
    }
    return insert(Job).values({**values, "run_at": _run_at()})


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
    quote = _PG.identifier_preparer.quote
    return quote(job.name) if schema is None else f"{quote(schema)}.{quote(job.name)}"


def notify() -> Select[tuple[object]]:
    """Queue a wakeup on ``channel`` carrying the queue name (never the payload: NOTIFY caps
    payloads at 8000 bytes). Delivered only when the surrounding transaction commits."""
    return select(func.pg_notify(bindparam("channel", type_=Text), bindparam("queue", type_=Text)))


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
    # ARRAY(subquery) is an InitPlan: the selection runs once, and the UPDATE fetches exactly the
    # rows the LIMIT kept by primary key. A join against a CTE instead left the join to the
    # planner, which (the CTE's row count being a guess) hashed it against a scan of the whole
    # table: a claim of 135 jobs from 20,000 took 3.1 ms instead of 0.9.
    picked = (
        select(job.c.id)
        .where(
            job.c.state == PENDING,
            job.c.concurrency_key.is_(None),
            job.c.queue == bindparam("queue", type_=Text),
            job.c.run_at <= func.now(),
            # A filter on the same index scan: stepping over the few crashed rows at the head of
            # the line costs nothing and needs no index of its own.
            _crash_rule(),
            _not_paused(),
        )
        .order_by(job.c.priority, job.c.run_at, job.c.id)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update(skip_locked=True)
    )
    return _mark_claimed(
        update(job).where(job.c.id == func.any(func.array(picked.scalar_subquery())))
    )


def _not_paused() -> ColumnElement[bool]:
    # The queue is not paused: uncorrelated with the job rows, so PostgreSQL runs it once per
    # claim (an InitPlan, one primary-key probe of a tiny table) and a paused queue's claim reads
    # no job at all. A pause therefore holds from the next claim of every worker on.
    paused: Select[Any] = select(literal_column("1")).where(
        queue_state.c.queue == bindparam("queue", type_=Text),
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


def _mark_claimed(stmt: Update) -> Select[Any]:
    # Rows in claim order (a batch's jobs start in the order they come): fetched by primary key,
    # the UPDATE returns them in id order, so the statement sorts what it claimed.
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
        .returning(*CLAIMED_COLUMNS, job.c.run_at)
        .cte("claimed")
    )
    return select(*(claimed.c[c.name] for c in CLAIMED_COLUMNS)).order_by(
        claimed.c.priority, claimed.c.run_at, claimed.c.id
    )


#: First key of the two-key advisory locks sqla-jobs takes (hashtext('sqla_jobs')): a namespace so
#: our locks cannot collide with the application's single-key advisory locks.
ADVISORY_NAMESPACE = -1196525586


def _per_key_rank() -> ColumnElement[int]:
    # A job's place in its key's line: priority, then run_at, then id (per-key FIFO).
    return (
        func.row_number()
        .over(
            partition_by=job.c.concurrency_key,
            order_by=(job.c.priority, job.c.run_at, job.c.id),
        )
        .label("rank")
    )


def _due_keyed(key: ColumnElement[bool]) -> tuple[ColumnElement[bool], ...]:
    # Pending, keyed as ``key`` says, in ``queue``, due: the keyed index's predicate comes first.
    return (
        job.c.state == PENDING,
        key,
        job.c.queue == bindparam("queue", type_=Text),
        job.c.run_at <= func.now(),
        _not_paused(),
    )


def lock_keys() -> Select[tuple[str]]:
    """Step 1 of the keyed claim: try-lock the concurrency keys of up to ``scan`` due keyed jobs of
    ``queue``, in claim order; returns the keys this transaction now holds.

    Takes transaction-scoped advisory locks (``pg_try_advisory_xact_lock``, never waiting): a key
    another worker is claiming right now is skipped, not waited for. The locks are released when
    the claim transaction commits. Served by ``sqla_jobs_job_keyed_idx``.
    """
    heads = (
        select(
            job.c.concurrency_key,
            job.c.priority,
            job.c.run_at,
            job.c.id,
            _per_key_rank(),
        )
        .where(*_due_keyed(job.c.concurrency_key.is_not(None)))
        .cte("heads")
        .prefix_with("MATERIALIZED")
    )
    # Lock only the keys we may claim this round (a fence again): a filter evaluated over every
    # head would lock keys we then leave, starving other workers of them for no reason.
    candidates = (
        select(heads.c.concurrency_key)
        .where(heads.c.rank == 1)
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
    every claim committed by their previous holders. Returns :data:`CLAIMED_COLUMNS`.
    """
    keys = bindparam("keys", type_=ARRAY(Text))
    ranked = (
        select(
            job.c.id,
            job.c.concurrency_key,
            job.c.concurrency_limit,
            job.c.priority,
            job.c.run_at,
            _per_key_rank(),
        )
        .where(*_due_keyed(job.c.concurrency_key == func.any(keys)), _crash_rule())
        .cte("ranked")
        .prefix_with("MATERIALIZED")
    )
    running = (
        select(job.c.concurrency_key, func.count().label("n"))
        .where(job.c.state == RUNNING, job.c.concurrency_key == func.any(keys))
        .group_by(job.c.concurrency_key)
        .cte("running")
        .prefix_with("MATERIALIZED")
    )
    picked = (
        select(ranked.c.id)
        .select_from(
            ranked.outerjoin(running, running.c.concurrency_key == ranked.c.concurrency_key)
        )
        .where(ranked.c.rank <= ranked.c.concurrency_limit - func.coalesce(running.c.n, 0))
        .order_by(ranked.c.priority, ranked.c.run_at, ranked.c.id)
        .limit(bindparam("limit", type_=BigInteger))
    )
    # By primary key from an InitPlan's array, as in claim(). state is re-checked on the latest
    # row version by the UPDATE itself (READ COMMITTED).
    return _mark_claimed(
        update(job).where(
            job.c.id == func.any(func.array(picked.scalar_subquery())), job.c.state == PENDING
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


def _end_held_run(state: ColumnElement[str]) -> AnyUpdate:
    # Job ``id`` (lease ``token``) ends in the terminal ``state``, ``error`` in ``last_error``.
    return (
        update(job)
        .where(_one_held())
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


def _one_held() -> ColumnElement[bool]:
    return and_(
        job.c.id == bindparam("id", type_=BigInteger),
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


# -- operations: what an operator does to jobs and queues (sqla_jobs._ops) --------------------------


def lock_jobs() -> Select[Any]:
    """The jobs ``ids`` that exist, with state, queue and whether a cancel was requested, locked
    (``FOR UPDATE``) so that an operation sees and changes them as one: a worker's completion of
    one of them waits for the operator's transaction, and the other way round. Primary key."""
    return (
        select(job.c.id, job.c.state, job.c.queue, job.c.cancel_requested_at.is_not(None))
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
        select(job.c.id, job.c.state, job.c.queue, job.c.cancel_requested_at.is_not(None))
        .where(
            job.c.state == func.any(bindparam("states", type_=ARRAY(Text))),
            or_(queue.is_(None), job.c.queue == queue),
            or_(kind.is_(None), job.c.kind == kind),
        )
        .order_by(job.c.id)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update()
    )


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
