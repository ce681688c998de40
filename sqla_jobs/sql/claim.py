"""The claim: one builder, :func:`claim_jobs`, composed from a selection (unkeyed or keyed; a
worker's or a test's) and the returned columns (``meta``, ``due_at``); each variant a worker or
``sqla_jobs.testing`` runs is a named one-liner, pinned by its own golden file.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Select,
    Text,
    bindparam,
    func,
    select,
    true,
    update,
)

from sqla_jobs.sql.claimed import CLAIMED_COLUMNS as CLAIMED_COLUMNS
from sqla_jobs.sql.claimed import mark_claimed
from sqla_jobs.sql.rate_limits import rated_pick
from sqla_jobs.sql.scans import (
    crash_rule,
    due_now,
    keyed_in,
    not_paused,
    priority_heads,
    unkeyed_in,
)
from sqla_jobs.sql.tables import (
    ONE,
    PENDING,
    RUNNING,
    job,
)
from sqla_jobs.sql.testing import due_for_testing

__all__ = [
    "BEGIN_WITHOUT_JIT",
    "CLAIMED_COLUMNS",
    "LISTEN_SESSION",
    "claim",
    "claim_for_testing",
    "claim_jobs",
    "claim_keyed",
    "claim_keyed_for_testing",
    "claim_keyed_with_due_at",
    "claim_keyed_with_meta",
    "claim_keyed_with_meta_and_due_at",
    "claim_rated",
    "claim_with_due_at",
    "claim_with_meta",
    "claim_with_meta_and_due_at",
]

#: How the keyed claim opens its transaction: JIT compilation off until it ends. The planner's
#: estimate of the claim's recursive scans is not bounded by the few hundred rows they read; on a
#: large backlog it passes ``jit_above_cost``, and compiling then costs more than the claim. One
#: message, in the round trip a lone ``BEGIN`` takes; ``SET LOCAL`` holds through PgBouncer's
#: transaction pooling.
BEGIN_WITHOUT_JIT = "BEGIN; SET LOCAL jit = off"

#: The session of a worker's LISTEN connection, whose thread claims for an idle worker
#: (``sqla_jobs.worker.handoff``). The claim commits without waiting for its WAL flush (the handler's
#: commit or the job's outcome flushes it; a server crash before then runs the job again, as any
#: crash does), and keeps its generic plan once prepared: left to choose, the server plans it anew
#: at every run, on the pickup's path. A LISTEN holds a session of its own: no pool's clients share it.
LISTEN_SESSION = "SET synchronous_commit = off; SET plan_cache_mode = force_generic_plan"


def claim_jobs(
    *,
    keyed: bool,
    meta: bool = False,
    due_at: bool = False,
    for_testing: bool = False,
    rated: bool = False,
) -> Select[Any]:
    """The claim, in one atomic statement: one UPDATE of the jobs a selection picked (``FOR UPDATE
    SKIP LOCKED`` in the unkeyed claim; under the keys' advisory locks in the keyed one), set
    ``running`` under one fresh lease token, returning :data:`CLAIMED_COLUMNS` in claim order.

    ``keyed``: the jobs of the concurrency keys ``keys`` (:func:`claim_keyed`), else the unkeyed
    jobs (:func:`claim`). ``meta``: each job's ``meta`` after those columns. ``due_at``: when each
    job became due, in microseconds on the worker's ``time.monotonic()`` clock sent as
    ``monotonic_us``, as the last column. ``for_testing``: only the jobs the test's transaction
    wrote, due by a clock moved forward (:func:`claim_for_testing`). ``rated``: the rate limited
    jobs of the limiters this transaction holds (:func:`claim_rated`; ``keyed`` is then ignored).
    Each variant a caller runs is a named builder below, pinned by its golden file; ``keyed`` has
    no default, so this one is not a builder of its own.
    """
    due = due_for_testing() if for_testing else due_now()
    # A test's inline runs take rate limited jobs too, without their limit.
    if rated:
        picked = rated_pick(due)
    else:
        picked = _keyed_pick(due, for_testing) if keyed else _unkeyed_pick(due, for_testing)
    return mark_claimed(update(job).where(*picked), meta, due_at)


def claim() -> Select[Any]:
    """Claim up to ``limit`` due jobs of ``queue`` for ``worker``, in one atomic statement.

    Locks the claimed rows (``FOR UPDATE SKIP LOCKED``: rows another worker holds are stepped over,
    never waited for); sets them ``running`` with a fresh lease token (one per claim) and a lease
    of ``lease`` from the database's ``now()``, and counts the attempt now, at claim time, so a job
    that kills its worker cannot be retried forever. Jobs that crashed a worker before are taken
    as :func:`~sqla_jobs.sql.scans.crash_rule` says (``crashed_ok``, ``last_life_ok``; both default true). Returns
    :data:`CLAIMED_COLUMNS`, in claim order. Served by ``sqla_jobs_job_claim_idx`` (partial,
    pending rows only): an ordered index scan; the only sort is of the rows it claimed.
    """
    return claim_jobs(keyed=False)


def claim_with_meta() -> Select[Any]:
    """:func:`claim`, returning each job's ``meta`` too, after :data:`CLAIMED_COLUMNS`: the claim of
    a worker whose middleware reads ``ctx.meta`` (tracing reads the trace context stored at
    enqueue). Locks and selects what :func:`claim` does; a worker without such a middleware runs
    :func:`claim` and never reads the column."""
    return claim_jobs(keyed=False, meta=True)


def claim_with_due_at() -> Select[Any]:
    """:func:`claim`, returning each job's ``due_at`` too, as the last column: when the job became
    due, in microseconds of the ``time.monotonic()`` clock of the worker that sends it as
    ``monotonic_us`` (:func:`claim_jobs`). The claim of a worker with metrics or the throughput
    tally (its pickup delay); a worker without them runs :func:`claim` and never computes the
    column."""
    return claim_jobs(keyed=False, due_at=True)


def claim_with_meta_and_due_at() -> Select[Any]:
    """:func:`claim_with_meta` with ``due_at`` as the last column (:func:`claim_with_due_at`)."""
    return claim_jobs(keyed=False, meta=True, due_at=True)


def claim_keyed() -> Select[Any]:
    """Step 2 of the keyed claim, in the same transaction as :func:`~sqla_jobs.sql.scans.lock_keys` and after it: claim
    up to ``limit`` due jobs of ``queue`` whose key is in ``keys``, at most
    ``concurrency_limit - running`` per key, in per-key order.

    Exact under concurrency: the transaction holds the keys' advisory locks, so no other worker is
    claiming them, and this statement's snapshot is taken after the locks were granted, so it sees
    every claim committed by their previous holders. Reads, per key, at most what the key can
    take under the limit of its first pending job, for each priority it has (an index range scan
    of ``sqla_jobs_job_keyed_idx`` that stops at the first job not due). Returns
    :data:`CLAIMED_COLUMNS`.
    """
    return claim_jobs(keyed=True)


def claim_keyed_with_meta() -> Select[Any]:
    """:func:`claim_keyed`, returning each job's ``meta`` too, after :data:`CLAIMED_COLUMNS` (see
    :func:`claim_with_meta`)."""
    return claim_jobs(keyed=True, meta=True)


def claim_keyed_with_due_at() -> Select[Any]:
    """:func:`claim_keyed`, returning each job's ``due_at`` too, as the last column (see
    :func:`claim_with_due_at`)."""
    return claim_jobs(keyed=True, due_at=True)


def claim_keyed_with_meta_and_due_at() -> Select[Any]:
    """:func:`claim_keyed_with_meta` with ``due_at`` as the last column."""
    return claim_jobs(keyed=True, meta=True, due_at=True)


def claim_rated() -> Select[Any]:
    """Step 3 of the rate limited claim, in the transaction that holds the limiters ``keys``
    (:func:`~sqla_jobs.sql.rate_limits.lock_rate_limiters`) and the concurrency keys
    ``concurrency_keys`` (:func:`~sqla_jobs.sql.rate_limits.lock_rated_concurrency_keys`): claim
    up to ``limit`` due jobs of ``queue`` within each limiter's room and each concurrency key's
    (:func:`~sqla_jobs.sql.rate_limits.rated_pick`). Exact: its snapshot is taken after those
    locks were granted, so it sees every start their previous holders logged. Per limiter, an
    index range scan of ``sqla_jobs_job_rated_idx``. Returns :data:`CLAIMED_COLUMNS` (the
    ``meta`` and ``due_at`` variants as :func:`claim` has them)."""
    return claim_jobs(keyed=False, rated=True)


def claim_for_testing() -> Select[Any]:
    """:func:`claim` as ``sqla_jobs.testing`` runs it, inside a test's transaction: only the jobs
    that transaction wrote (:data:`~sqla_jobs.sql.testing.WRITTEN_HERE`) unless ``all_jobs``, due by ``now()`` plus
    ``ahead_us`` microseconds (any ``run_at`` with ``delayed``). Locks and returns what
    :func:`claim` does; not for workers (``WRITTEN_HERE`` is a filter on every pending row)."""
    return claim_jobs(keyed=False, for_testing=True)


def claim_keyed_for_testing() -> Select[Any]:
    """:func:`claim_keyed` with :func:`claim_for_testing`'s selection (``all_jobs``,
    ``ahead_us``, ``delayed``): the concurrency limits hold as they do for a worker."""
    return claim_jobs(keyed=True, for_testing=True)


def _unkeyed_pick(
    due: tuple[ColumnElement[bool], ...], rated: bool
) -> tuple[ColumnElement[bool], ...]:
    # For each priority in ascending order, an index range scan of (queue, priority, run_at <=
    # now()): it stops at the priority's first job not due yet, so jobs scheduled for later are
    # never read. A plain ORDER BY priority, run_at, id over the whole queue instead walks every
    # scheduled entry whenever fewer jobs are due than the limit asks for (12,000 buffers with
    # 2M jobs a day ahead, on every idle worker's claim). The nested loop keeps the CTE's
    # priority order and the outer LIMIT stops pulling, so no row past the limit is locked.
    queue = bindparam("queue", type_=Text)
    # Nested in the claim's subquery: the statement still starts with its UPDATE's CTE.
    priorities = priority_heads(queue, (not_paused(),), nesting=True, rated=rated)
    limit = bindparam("limit", type_=BigInteger)
    under = (
        select(job.c.id)
        .where(
            *unkeyed_in(queue, rated=rated),
            job.c.priority == priorities.c.priority,
            *due,
            # A filter on the same index scan: stepping over the few crashed rows at the head of
            # the line costs nothing and needs no index of its own.
            crash_rule(),
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
    return (job.c.id == func.any(func.array(picked.scalar_subquery())),)


def _keyed_pick(
    due: tuple[ColumnElement[bool], ...], rated: bool
) -> tuple[ColumnElement[bool], ...]:
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
    # Each key's line, one row per priority it has (a loose index scan, as in key_heads), with
    # the room the key has left: its first pending job's limit (a key's jobs share one) less its
    # running jobs, and never more than the claim's limit.
    wanted = func.unnest(keys).table_valued("key").render_derived(name="wanted")
    first = (
        select(key, priority, job.c.concurrency_limit)
        .where(*keyed_in(queue, rated=rated), key == wanted.c.key, not_paused())
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
        .where(
            *keyed_in(queue, rated=rated),
            key == lines.c.concurrency_key,
            priority > lines.c.priority,
        )
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
            *keyed_in(queue, rated=rated),
            key == lines.c.concurrency_key,
            priority == lines.c.priority,
            *due,
            crash_rule(),
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
    # By primary key from an InitPlan's array, as in the unkeyed claim. state is re-checked on the latest
    # row version by the UPDATE itself (READ COMMITTED).
    return (job.c.id == func.any(func.array(picked.scalar_subquery())), job.c.state == PENDING)


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
