"""The loose index scans a claim reads the pending lines with, and the statements made of them alone:
step 1 of the keyed claim (:func:`lock_keys`) and the idle poll (:func:`claimable_queues`).

PostgreSQL before 18 cannot skip through an index itself: a recursive CTE steps from one
(queue, priority), or (key, priority), to the next by one index descent each, so the cost follows
the priorities and keys present, never the jobs scheduled behind them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    false,
    func,
    literal_column,
    or_,
    select,
    true,
    tuple_,
)

from sqla_jobs.sql.tables import (
    ADVISORY_NAMESPACE,
    ONE,
    PENDING,
    job,
    queue_state,
)
from sqla_jobs.sql.testing import due_for_testing

__all__ = [
    "LAST_PRIORITY",
    "HeadTest",
    "claimable_queues",
    "crash_rule",
    "due_head",
    "due_now",
    "key_heads",
    "keyed_in",
    "lock_keys",
    "lock_keys_for_testing",
    "not_paused",
    "priority_heads",
    "unkeyed_in",
]


def due_now() -> tuple[ColumnElement[bool], ...]:
    """The worker's selection: due by the database's ``now()``."""
    return (job.c.run_at <= func.now(),)


#: Past every ``priority`` (a SMALLINT): ``(key, LAST_PRIORITY)`` sorts after all of a key's
#: index entries, so ``(concurrency_key, priority) > (key, LAST_PRIORITY)`` is the next key.
LAST_PRIORITY: ColumnElement[int] = literal_column("CAST(32767 AS SMALLINT)")


def due_head(run_at: ColumnElement[Any]) -> ColumnElement[bool]:
    """Whether a line's first job, with this ``run_at``, is due now."""
    # Whether the first job of a priority (of a key) is due: its index entries are in run_at
    # order, so if the first is not due none is.
    return run_at <= func.now()


def unkeyed_in(
    queue: ColumnElement[str], *, rated: bool = False
) -> tuple[ColumnElement[bool], ...]:
    """``queue``'s pending unkeyed jobs without a rate limit, as ``sqla_jobs_job_claim_idx``
    holds them; ``rated``: with the rate limited ones too (a test's inline runs, which ignore
    rate limits; no index holds them all)."""
    # The claim index's predicate first, then its leading column.
    return (
        job.c.state == PENDING,
        job.c.concurrency_key.is_(None),
        *_unrated(rated),
        job.c.queue == queue,
    )


def keyed_in(queue: ColumnElement[str], *, rated: bool = False) -> tuple[ColumnElement[bool], ...]:
    """``queue``'s pending keyed jobs without a rate limit, as ``sqla_jobs_job_keyed_idx`` holds
    them; ``rated``: as in :func:`unkeyed_in`."""
    # The keyed index's predicate first, then its leading column.
    return (
        job.c.state == PENDING,
        job.c.concurrency_key.is_not(None),
        *_unrated(rated),
        job.c.queue == queue,
    )


def _unrated(rated: bool) -> tuple[ColumnElement[bool], ...]:
    # Rate limited jobs are the rate limited claim's (sqla_jobs.sql.rate_limits): in the index
    # predicates, so the plain and keyed claims never scan past due jobs a limit holds.
    return () if rated else (job.c.rate_key.is_(None),)


def priority_heads(
    queue: ColumnElement[str],
    first_where: tuple[ColumnElement[bool], ...] = (),
    *,
    nesting: bool = False,
    rated: bool = False,
) -> Any:
    """The distinct priorities of ``queue``'s pending unkeyed jobs, ascending, each with the
    ``run_at`` of its first job (``due`` when that has passed), as a recursive CTE.

    A loose index scan of ``sqla_jobs_job_claim_idx``: each step is one descent to the first
    entry past the previous priority, so the cost is one probe per priority present, whatever
    the number of jobs behind each (PostgreSQL before 18 cannot skip through an index itself).
    """
    unkeyed = unkeyed_in(queue, rated=rated)
    columns = (job.c.priority, job.c.run_at, due_head(job.c.run_at).label("due"))
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


def not_paused(queue: ColumnElement[str] | None = None) -> ColumnElement[bool]:
    """Whether ``queue`` (the bound ``queue`` by default) is not paused."""
    # The queue is not paused: uncorrelated with the job rows, so PostgreSQL runs it once per
    # claim (an InitPlan, one primary-key probe of a tiny table) and a paused queue's claim reads
    # no job at all. A pause therefore holds from the next claim of every worker on.
    paused: Select[Any] = select(literal_column("1")).where(
        queue_state.c.queue == (bindparam("queue", type_=Text) if queue is None else queue),
        queue_state.c.paused_at.is_not(None),
    )
    return ~paused.exists()


def crash_rule() -> ColumnElement[bool]:
    """Which jobs that crashed a worker before a claim may take (``crashed_ok``, ``last_life_ok``)."""
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


#: Whether the first job of a (key, priority) is due (:func:`due_head` for a worker).
HeadTest = Callable[[ColumnElement[Any]], ColumnElement[bool]]


def key_heads(
    queue: ColumnElement[str],
    filters: tuple[ColumnElement[bool], ...],
    is_due: HeadTest,
    first_where: tuple[ColumnElement[bool], ...] = (),
    nesting: bool = False,
    rated: bool = False,
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
        .where(*keyed_in(queue, rated=rated), *filters, *first_where)
        .order_by(*order)
        .limit(ONE)
        .correlate_except(job)
    )
    heads = first.cte("heads", recursive=True, nesting=nesting)
    past = case((heads.c.due, LAST_PRIORITY), else_=heads.c.priority)
    after = (
        select(*columns)
        .where(
            *keyed_in(queue, rated=rated),
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
    (:func:`key_heads`) reads each key's head and nothing behind it, one descent per key (and per
    priority of a key before its first due one); the heads are then sorted in claim order.
    """
    return _lock_keys((), due_head)


def _lock_keys(
    filters: tuple[ColumnElement[bool], ...], is_due: HeadTest, rated: bool = False
) -> Select[tuple[str]]:
    queue = bindparam("queue", type_=Text)
    heads = key_heads(queue, filters, is_due, (not_paused(),), rated=rated)
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


def lock_keys_for_testing() -> Select[tuple[str]]:
    """:func:`lock_keys` with :func:`claim_for_testing`'s selection (``all_jobs``, ``ahead_us``,
    ``delayed``)."""
    # The selection is a filter on every step (not an index bound): a step then lands on the
    # first selected entry of a key, its head. Fine for a test's few rows.
    return _lock_keys(due_for_testing(), lambda _: true(), rated=True)


def claimable_queues() -> Select[tuple[str, bool, float | None]]:
    """Which of ``queues`` have a job a claim could take now, and how long until the next one
    becomes claimable: the idle poll of a worker, one statement for all its queues.

    One row per queue not paused, in the order given: (queue, due, wait). ``due``: it has a due
    unkeyed job, or (with ``keyed``) a due keyed job, whether or not its key has room (the keyed
    claim decides). ``wait``: seconds, by the database's clock, until its first unkeyed job not
    due yet (always > 0; NULL if none): the worker sleeps until then. A paused queue, and keyed
    jobs (their key may be at its limit then), are left out of it, so a worker never wakes for a
    time already past. Locks nothing. Loose index scans of ``sqla_jobs_job_claim_idx`` and
    ``sqla_jobs_job_keyed_idx`` (:func:`priority_heads`, :func:`key_heads`): per queue, one
    descent per priority present (two for a priority with due jobs), and per key of its keyed
    jobs, however many jobs are scheduled for later.
    """
    queues = bindparam("queues", type_=ARRAY(Text))
    wanted = func.unnest(queues).table_valued("queue", with_ordinality="n").render_derived("wanted")
    queue = wanted.c.queue
    lines = priority_heads(queue, nesting=True)
    # A line whose first job is due: its first job still to come is one more descent away.
    later = (
        select(job.c.run_at)
        .where(*unkeyed_in(queue), job.c.priority == lines.c.priority, job.c.run_at > func.now())
        .order_by(job.c.run_at, job.c.id)
        .limit(ONE)
        .correlate_except(job)
        .scalar_subquery()
    )
    unkeyed = (
        select(
            func.bool_or(lines.c.due).label("due"),
            func.min(case((lines.c.due, later), else_=lines.c.run_at)).label("next_at"),
        )
        .select_from(lines)
        .lateral("unkeyed")
    )
    keyed = key_heads(queue, (), due_head, nesting=True)
    due = func.coalesce(
        or_(
            unkeyed.c.due,
            and_(
                bindparam("keyed", type_=Boolean),
                select(literal_column("1")).select_from(keyed).where(keyed.c.due).exists(),
            ),
        ),
        false(),
    )
    wait = cast(func.extract("epoch", unkeyed.c.next_at - func.now()), Float)
    return (
        select(queue, due.label("due"), wait.label("wait"))
        .select_from(wanted.join(unkeyed, true()))
        .where(not_paused(queue))
        .order_by(wanted.c.n)
    )
