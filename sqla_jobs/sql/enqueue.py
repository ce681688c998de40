"""Enqueue: the INSERT of one job (with its wakeup folded in), of many from parallel arrays, the ids
and the ``COPY`` of a bulk enqueue, and the wakeup itself (``pg_notify``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Float,
    Insert,
    Select,
    Text,
    bindparam,
    cast,
    func,
    insert,
    literal_column,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB, REGCLASS
from sqlalchemy.sql.elements import TextClause

from sqla_jobs.model import (
    Job,
)
from sqla_jobs.sql import columns as _row
from sqla_jobs.sql.tables import (
    PG_DIALECT,
    job,
    job_table_name,
    requested_run_at,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyInsert


__all__ = [
    "BULK_ARRAY_PARAMS",
    "BULK_COLUMNS",
    "COPY_COLUMNS",
    "COPY_SAVEPOINT",
    "FILLED_COLUMNS",
    "NEW_ROW_DEFAULTS",
    "bound_values",
    "copy_jobs",
    "insert_job",
    "insert_job_and_notify",
    "insert_jobs",
    "notify",
    "reserve_job_ids",
    "sleep_until",
]


#: What the database fills in when a job is inserted and only it knows: an insert returns these,
#: and enqueue builds the rest of the ``Job`` from what it bound and :data:`NEW_ROW_DEFAULTS`.
FILLED_COLUMNS = (job.c.id, job.c.run_at, job.c.created_at)
#: The other columns the database fills in, as the table's server defaults do for every new row
#: (constants, so the insert need not send them back: each returned column costs the client).
NEW_ROW_DEFAULTS = {"state": "pending", "attempts": 0, "crashes": 0, "interruptions": 0}


def insert_job(lean: bool = False) -> AnyInsert:
    """Insert one job; returns the :data:`FILLED_COLUMNS` (id, run_at, created_at).

    Parameters: queue, kind, payload (JSON text), priority, max_attempts, max_crashes,
    concurrency_key and concurrency_limit (both NULL for an unkeyed job), meta (JSON text or NULL),
    rate_key (NULL for a kind without a rate limit),
    and either run_at (aware datetime) or delay_us (microseconds, added to the database's
    ``now()``). Locks nothing beyond the new row. ``lean``: without the optional columns (meta,
    rate_key), for a job that has none of them.
    """
    return _insert_values(lean).returning(*FILLED_COLUMNS)


def _insert_values(lean: bool) -> Insert:
    return insert(Job).values({**bound_values(lean), "run_at": requested_run_at()})


def bound_values(lean: bool = False) -> dict[str, Any]:
    """The job columns of :data:`~sqla_jobs.sql.columns.COLUMNS` as bind parameters (``lean``:
    without the optional ones)."""
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

    Parameters: arrays of equal length queues, kinds, payloads (JSON text), priority_heads,
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
    src = select(*values, requested_run_at()).select_from(rows)
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
    return select(ids.scalar_subquery().label("ids"), requested_run_at().label("run_at"))


#: The columns enqueue_many writes by COPY, in row order; the rest take their defaults.
COPY_COLUMNS = ("id", *BULK_COLUMNS, "run_at")


def copy_jobs(schema: str | None = None) -> TextClause:
    """``COPY ... FROM STDIN`` into the job table, of the :data:`COPY_COLUMNS`: enqueue_many's bulk
    path, the fastest way into a table (one multi-row insert per page instead of one executor row at
    a time). ``COPY`` has no RETURNING, so the ids come first from :func:`reserve_job_ids`.

    ``schema`` qualifies the table (``schema_translate_map`` does not reach into a text statement).
    """
    columns = ", ".join(map(PG_DIALECT.identifier_preparer.quote, COPY_COLUMNS))
    return text(f"COPY {job_table_name(schema)} ({columns}) FROM STDIN")


#: SAVEPOINT, ROLLBACK TO and RELEASE of the savepoint around a COPY that validates its payloads as
#: it goes: a bad one rolls the COPY back and leaves the caller's transaction usable.
COPY_SAVEPOINT = (
    "SAVEPOINT sqla_jobs_copy",
    "ROLLBACK TO SAVEPOINT sqla_jobs_copy",
    "RELEASE SAVEPOINT sqla_jobs_copy",
)


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
