"""What the metrics read and write: the queue sampler's lock and sample, and the per-minute
throughput counts workers add to and the dashboard reads.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Float,
    Insert,
    Integer,
    Select,
    Text,
    bindparam,
    cast,
    column,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.expression import TableClause

from sqla_jobs.sql.tables import (
    ADVISORY_NAMESPACE,
    CANCELLED,
    COMPLETED,
    DEAD,
    PENDING,
    RUNNING,
    job,
    queue_state,
    schedule,
    throughput,
)

__all__ = [
    "SAMPLE_LOCK_NAME",
    "SCHEDULED_CAP",
    "THROUGHPUT_COUNTS",
    "count_scheduled",
    "estimate_waiting",
    "read_throughput",
    "record_throughput",
    "sample_paused_queues",
    "sample_queues",
    "sample_schedule_lags",
    "try_lock_sampler",
]


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


#: The pending jobs the claim index holds (unkeyed, without a rate limit).
_UNKEYED = (job.c.state == PENDING, job.c.concurrency_key.is_(None), job.c.rate_key.is_(None))
#: The pending jobs the keyed index holds (keyed, without a rate limit).
_KEYED = (job.c.state == PENDING, job.c.concurrency_key.is_not(None), job.c.rate_key.is_(None))
#: The pending jobs the rated index holds (with a rate limit, keyed or not).
_RATED = (job.c.state == PENDING, job.c.rate_key.is_not(None))
#: How many jobs not yet due :func:`count_scheduled` reads at most per (queue, priority).
SCHEDULED_CAP = 10_000


def _queue_heads() -> Any:
    """Every (queue, priority) with unkeyed pending jobs, found by a loose index scan of the claim
    index: one probe each, whatever the number of jobs under it."""
    order = (job.c.queue, job.c.priority)
    first = select(job.c.queue, job.c.priority).where(*_UNKEYED).order_by(*order).limit(1)
    heads = first.cte("heads", recursive=True)
    after = (
        select(job.c.queue, job.c.priority)
        .where(
            *_UNKEYED,
            tuple_(job.c.queue, job.c.priority) > tuple_(heads.c.queue, heads.c.priority),
        )
        .order_by(*order)
        .limit(1)
        .lateral("next")
    )
    return heads.union_all(
        select(after.c.queue, after.c.priority).select_from(heads).join(after, true())
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
    step over), rate limited ones from ``sqla_jobs_job_rated_idx`` (likewise; their due ones are
    also counted as ``rate_limited`` rows: held by their limit, or about to start), running jobs from ``sqla_jobs_job_running_idx`` and finished ones from
    ``sqla_jobs_job_finished_idx``, each partial and holding only its rows. A plain read: no locks.
    """
    heads = _queue_heads()
    due_now = job.c.run_at <= func.now()
    under = (
        select(func.count().label("jobs"), func.min(job.c.run_at).label("oldest"))
        .where(*_UNKEYED, job.c.queue == heads.c.queue, job.c.priority == heads.c.priority, due_now)
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
        .where(*_KEYED)
        .group_by(job.c.queue)
    )
    # Rate limited jobs, due: counted among the due ones, and on their own (held by their limit,
    # or about to start). Read from the rated index, as keyed jobs from theirs: an empty index
    # when no kind has a limit, so an idle sample costs what it did.
    due_rated = (
        select(job.c.queue, literal_column("'due'"), func.count().filter(due_now), keyed_age)
        .where(*_RATED)
        .group_by(job.c.queue)
    )
    rate_limited = (
        select(job.c.queue, literal_column("'rate_limited'"), func.count(), null())
        .where(*_RATED, due_now)
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
    return due_unkeyed.union_all(due_keyed, due_rated, rate_limited, running, finished)


def sample_paused_queues() -> Select[Any]:
    """Rows of (queue, ``'paused'``, 1, NULL), one per paused queue, in :func:`sample_queues`'
    shape. A plain read of ``sqla_jobs_queue``, which holds a row per queue an operator touched."""
    return select(
        queue_state.c.queue, literal_column("'paused'"), literal_column("1"), null()
    ).where(queue_state.c.paused_at.is_not(None))


def count_scheduled() -> Any:
    """Rows of (queue, ``'scheduled'``, jobs, NULL): pending jobs not yet due, by queue, in
    :func:`sample_queues`' shape. A count reads an index entry per job, so the unkeyed ones are
    counted up to :data:`SCHEDULED_CAP` per (queue, priority) of the loose index scan (the claim
    index's entries past ``now()``; a queue at the cap has at least that many), which bounds the
    cost whatever the backlog; the keyed ones are all counted from the keyed index, which
    :func:`sample_queues` reads whole already. No locks."""
    heads = _queue_heads()
    later = job.c.run_at > func.now()
    capped = (
        select(literal_column("1"))
        .where(*_UNKEYED, job.c.queue == heads.c.queue, job.c.priority == heads.c.priority, later)
        .limit(SCHEDULED_CAP)
        .correlate(heads)
        .lateral("capped")
    )
    under = select(func.count().label("jobs")).select_from(capped).lateral("under")
    unkeyed = (
        select(
            heads.c.queue,
            literal_column("'scheduled'").label("state"),
            func.least(cast(func.sum(under.c.jobs), BigInteger), SCHEDULED_CAP).label("jobs"),
            null(),
        )
        .select_from(heads)
        .join(under, true())
        .group_by(heads.c.queue)
    )
    keyed = (
        select(job.c.queue, literal_column("'scheduled'"), func.count().filter(later), null())
        .where(*_KEYED)
        .group_by(job.c.queue)
    )
    rated = (
        select(job.c.queue, literal_column("'scheduled'"), func.count().filter(later), null())
        .where(*_RATED)
        .group_by(job.c.queue)
    )
    return unkeyed.union_all(keyed, rated)


def estimate_waiting() -> Select[Any]:
    """The jobs waiting on their parents in the job table (bound as ``job_table``, text, as
    :func:`~sqla_jobs.sql.tables.job_table_name` renders it), estimated as the planner does: the
    share of ``waiting`` in the ``state`` column's most common values at the last ANALYZE, times
    the rows the table holds now (its rows per page then, times its pages now). No index holds
    the waiting jobs, so an exact count would read every row of a large waiting backlog at every
    sample; this reads the catalog only, whatever the backlog. 0 before the table's first
    ANALYZE, or with no waiting job then."""
    table = cast(bindparam("job_table", type_=Text), REGCLASS)
    cls = TableClause(
        "pg_class",
        *(column(n) for n in ("oid", "relname", "relnamespace", "reltuples", "relpages")),
        schema="pg_catalog",
    )
    space = TableClause("pg_namespace", column("oid"), column("nspname"), schema="pg_catalog")
    stats = TableClause(
        "pg_stats",
        *(column(n) for n in ("schemaname", "tablename", "attname", "most_common_vals")),
        column("most_common_freqs", ARRAY(Float)),
        schema="pg_catalog",
    )
    values = cast(cast(stats.c.most_common_vals, Text), ARRAY(Text))
    share = stats.c.most_common_freqs[func.array_position(values, literal_column("'waiting'"))]
    pages = func.pg_relation_size(cls.c.oid) / func.current_setting(
        literal_column("'block_size'")
    ).cast(Float)
    rows = func.greatest(cls.c.reltuples, literal_column("0")) / func.nullif(
        cls.c.relpages, literal_column("0")
    )
    estimate = (
        select(rows * pages * share)
        .select_from(
            cls.join(space, space.c.oid == cls.c.relnamespace).join(
                stats,
                (stats.c.schemaname == space.c.nspname) & (stats.c.tablename == cls.c.relname),
            )
        )
        .where(cls.c.oid == table, stats.c.attname == literal_column("'state'"))
        .scalar_subquery()
    )
    return select(
        cast(func.round(func.coalesce(estimate, literal_column("0"))), BigInteger).label("waiting")
    )


def sample_schedule_lags() -> Select[Any]:
    """Rows of (schedule name, seconds its next tick is overdue by the database's clock, 0 when
    on time) for every schedule not paused. A plain read of ``sqla_jobs_schedule`` (one row per
    schedule): a scheduler that stopped ticking shows here as a lag that grows."""
    overdue = func.date_part(literal_column("'epoch'"), func.now() - schedule.c.next_tick_at)
    return (
        select(schedule.c.name, func.greatest(overdue, literal_column("0")).label("lag"))
        .where(schedule.c.paused_at.is_(None), schedule.c.next_tick_at.is_not(None))
        .order_by(schedule.c.name)
    )


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
