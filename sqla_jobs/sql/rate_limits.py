"""The rate limited claim's statements, run in one transaction by a worker whose kinds have rate
limits: lock the limiters (:func:`lock_rate_limiters`), try-lock the concurrency keys of their
keyed jobs (:func:`lock_rated_concurrency_keys`), claim (``claim_rated`` in
:mod:`~sqla_jobs.sql.claim`, whose selection is :func:`rated_pick`), log the starts
(:func:`log_rate_starts`) and say when each limiter at its limit admits its next start
(:func:`rate_waits`). The limiter rows outside a claim (created, listed, pruned) are
:mod:`~sqla_jobs.sql.limiters`'.

A limiter's ``starts`` holds its latest starts, newest first, at most ``allowed`` of them: a start
at ``now()`` is admitted iff fewer than ``allowed`` of them are later than ``now() - per``. Every
time is the database's. The worker sends its limits per kind (``kinds``, ``limits``, ``pers`` in
seconds): a limiter's kind is its ``rate_key`` up to the first space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)

from sqla_jobs.sql.scans import LAST_PRIORITY, crash_rule, due_head, not_paused
from sqla_jobs.sql.tables import (
    ADVISORY_NAMESPACE,
    ONE,
    ONE_SECOND,
    PENDING,
    RUNNING,
    ids_param,
    job,
    rate_limiter,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyUpdate

__all__ = [
    "lock_rate_limiters",
    "lock_rated_concurrency_keys",
    "log_rate_starts",
    "rate_waits",
    "rated_in",
    "rated_pick",
]


def rated_in(queue: ColumnElement[str]) -> tuple[ColumnElement[bool], ...]:
    """``queue``'s pending rate limited jobs, as ``sqla_jobs_job_rated_idx`` holds them."""
    return (job.c.state == PENDING, job.c.rate_key.is_not(None), job.c.queue == queue)


def _limits() -> Any:
    # The worker's limits, one row per rate limited kind it runs.
    return (
        func.unnest(
            bindparam("kinds", type_=ARRAY(Text)),
            bindparam("limits", type_=ARRAY(Integer)),
            bindparam("pers", type_=ARRAY(Float)),
        )
        .table_valued("kind", "allowed", "per_s")
        .render_derived(name="limits")
    )


def _kind_of(rate_key: ColumnElement[str]) -> ColumnElement[str]:
    return func.split_part(rate_key, literal_column("' '"), ONE)


def _per(per_s: ColumnElement[float]) -> ColumnElement[Any]:
    # One expression wherever a window is measured, so the admission test and the announced
    # next start agree to the microsecond.
    return per_s * ONE_SECOND


def _used(starts: ColumnElement[Any], per_s: ColumnElement[float]) -> ColumnElement[int]:
    """How many of ``starts`` fall in the window before ``now()``."""
    s = func.unnest(starts).table_valued("s").render_derived(name="logged")
    return (
        select(func.count())
        .select_from(s)
        .where(s.c.s > func.now() - _per(per_s))
        .scalar_subquery()
    )


def _rate_heads(queue: ColumnElement[str]) -> Any:
    # Each limiter's head among the queue's pending rate limited jobs of the worker's kinds: a
    # loose index scan of sqla_jobs_job_rated_idx, as key_heads does for concurrency keys; the
    # cost follows the limiters and their priorities, never the jobs behind them.
    kinds = bindparam("kinds", type_=ARRAY(Text))
    key, priority = job.c.rate_key, job.c.priority
    order = (key, priority, job.c.run_at, job.c.id)
    columns = (key, priority, job.c.run_at, job.c.id, due_head(job.c.run_at).label("due"))
    mine = _kind_of(key).op("=")(func.any(kinds))
    first = select(*columns).where(*rated_in(queue), mine, not_paused()).order_by(*order).limit(ONE)
    heads = first.cte("heads", recursive=True)
    past = case((heads.c.due, LAST_PRIORITY), else_=heads.c.priority)
    after = (
        select(*columns)
        .where(*rated_in(queue), mine, tuple_(key, priority) > tuple_(heads.c.rate_key, past))
        .order_by(*order)
        .limit(ONE)
        .lateral("after")
    )
    return heads.union_all(select(*after.c).select_from(heads).join(after, true()))


def lock_rate_limiters() -> Select[tuple[str, bool, bool]]:
    """Step 1 of the rate limited claim: lock the limiters of up to ``scan`` limiters with due
    jobs in ``queue`` (of the worker's ``kinds``), in claim order, ``FOR UPDATE SKIP LOCKED``.

    Returns (rate_key, held, known) per limiter with a due job: ``held``, this transaction now
    holds its row until it ends (no other claim can count its window meanwhile); ``known``, the
    row exists (a limiter neither held nor known has no row yet:
    :func:`~sqla_jobs.sql.limiters.create_rate_limiters`).
    Never waits. Served by ``sqla_jobs_job_rated_idx`` (a loose index scan) and the limiters'
    primary key.
    """
    heads = _rate_heads(bindparam("queue", type_=Text))
    candidates = (
        select(heads.c.rate_key)
        .where(heads.c.due)
        .order_by(heads.c.priority, heads.c.run_at, heads.c.id)
        .limit(bindparam("scan", type_=BigInteger))
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    held = (
        select(rate_limiter.c.rate_key)
        .where(rate_limiter.c.rate_key == candidates.c.rate_key)
        .with_for_update(skip_locked=True)
        .lateral("held")
    )
    known = exists().where(rate_limiter.c.rate_key == candidates.c.rate_key)
    return select(
        candidates.c.rate_key, held.c.rate_key.is_not(None).label("held"), known.label("known")
    ).select_from(candidates.outerjoin(held, true()))


def lock_rated_concurrency_keys() -> Select[tuple[str]]:
    """Step 2 of the rate limited claim, for kinds with a concurrency limit too: try-lock the
    concurrency keys of the first ``scan`` due jobs of each limiter in ``keys`` (held by step 1)
    in ``queue``; returns the keys now held. The same advisory locks as the keyed claim's, so
    the two never claim one key at once; never waits."""
    wanted = func.unnest(bindparam("keys", type_=ARRAY(Text))).table_valued("key")
    wanted = wanted.render_derived(name="wanted")
    queue = bindparam("queue", type_=Text)
    firsts = (
        select(job.c.concurrency_key)
        .where(
            *rated_in(queue),
            job.c.rate_key == wanted.c.key,
            job.c.run_at <= func.now(),
            job.c.concurrency_key.is_not(None),
        )
        .order_by(job.c.priority, job.c.run_at, job.c.id)
        .limit(bindparam("scan", type_=BigInteger))
        .lateral("firsts")
    )
    keys = (
        select(firsts.c.concurrency_key)
        .distinct()
        .select_from(wanted.join(firsts, true()))
        .cte("concurrency_keys")
        .prefix_with("MATERIALIZED")
    )
    return select(keys.c.concurrency_key).where(
        func.pg_try_advisory_xact_lock(
            literal_column(str(ADVISORY_NAMESPACE)), func.hashtext(keys.c.concurrency_key)
        )
    )


def rated_pick(due: tuple[ColumnElement[bool], ...]) -> tuple[ColumnElement[bool], ...]:
    """The rate limited claim's selection (step 3, composed into an UPDATE by
    :func:`~sqla_jobs.sql.claim.claim_jobs`): up to ``limit`` due jobs of ``queue`` from the
    limiters ``keys`` this transaction holds, at most each limiter's room (``allowed`` less its
    starts in the window), in per-limiter order (priority, run_at, id); a job with a concurrency
    key only if this transaction holds that key (``concurrency_keys``) and within its limit."""
    queue = bindparam("queue", type_=Text)
    ckeys = bindparam("concurrency_keys", type_=ARRAY(Text))
    limit = bindparam("limit", type_=BigInteger)
    limits = _limits()
    lim = (
        select(
            rate_limiter.c.rate_key,
            (limits.c.allowed - _used(rate_limiter.c.starts, limits.c.per_s)).label("room"),
        )
        .select_from(rate_limiter.join(limits, _kind_of(rate_limiter.c.rate_key) == limits.c.kind))
        .where(rate_limiter.c.rate_key == func.any(bindparam("keys", type_=ARRAY(Text))))
        .cte("room")
        .prefix_with("MATERIALIZED")
    )
    ckey = job.c.concurrency_key
    running = (
        select(ckey, func.count().label("n"))
        .where(job.c.state == RUNNING, ckey == func.any(ckeys))
        .group_by(ckey)
        .cte("running")
        .prefix_with("MATERIALIZED")
    )
    order = (job.c.priority, job.c.run_at, job.c.id)
    under = (
        select(job.c.id, job.c.rate_key, ckey, job.c.concurrency_limit, *order[:2])
        .where(
            *rated_in(queue),
            job.c.rate_key == lim.c.rate_key,
            *due,
            crash_rule(),
            or_(ckey.is_(None), ckey == func.any(ckeys)),
            not_paused(),
        )
        .order_by(*order)
        .limit(limit)
        .lateral("under")
    )
    in_key = func.row_number().over(
        partition_by=under.c.concurrency_key,
        order_by=(under.c.priority, under.c.run_at, under.c.id),
    )
    lined = (
        select(*under.c, lim.c.room, in_key.label("in_key"))
        .select_from(lim.join(under, true()))
        .where(lim.c.room > 0)
        .cte("lined")
        .prefix_with("MATERIALIZED")
    )
    # Within its concurrency key's room first: a job its key cannot run is no start.
    fits = (
        select(lined)
        .select_from(lined.outerjoin(running, running.c.concurrency_key == lined.c.concurrency_key))
        .where(
            or_(
                lined.c.concurrency_key.is_(None),
                lined.c.in_key <= lined.c.concurrency_limit - func.coalesce(running.c.n, 0),
            )
        )
        .subquery("fits")
    )
    in_limiter = func.row_number().over(
        partition_by=fits.c.rate_key, order_by=(fits.c.priority, fits.c.run_at, fits.c.id)
    )
    ranked = select(*fits.c, in_limiter.label("in_limiter")).subquery("ranked")
    picked = (
        select(ranked.c.id)
        .where(ranked.c.in_limiter <= ranked.c.room)
        .order_by(ranked.c.priority, ranked.c.run_at, ranked.c.id)
        .limit(limit)
    )
    return (job.c.id == func.any(func.array(picked.scalar_subquery())), job.c.state == PENDING)


def log_rate_starts() -> AnyUpdate:
    """Step 4, after the claim in its transaction: add the starts of the jobs ``ids`` just claimed
    to their limiters' logs (at ``now()``, the claim's time), keeping each limiter's ``allowed``
    latest, and set its ``allowed``, ``per`` and ``free_at`` (when the log stops limiting).
    Returns the limiters written. Touches only rows this transaction holds."""
    counts = (
        select(job.c.rate_key, func.count().label("n"))
        .where(job.c.id == func.any(ids_param()), job.c.rate_key.is_not(None))
        .group_by(job.c.rate_key)
        .subquery("counts")
    )
    limits = _limits()
    logged = select(func.unnest(rate_limiter.c.starts).label("s")).correlate(rate_limiter)
    new = select(func.now().label("s")).select_from(func.generate_series(ONE, counts.c.n))
    both = union_all(logged, new).subquery("both_")
    ring = select(both.c.s).order_by(both.c.s.desc()).limit(limits.c.allowed)
    return (
        update(rate_limiter)
        .where(
            rate_limiter.c.rate_key == counts.c.rate_key,
            _kind_of(rate_limiter.c.rate_key) == limits.c.kind,
        )
        .values(
            starts=func.array(ring.scalar_subquery()),
            allowed=limits.c.allowed,
            per=_per(limits.c.per_s),
            free_at=func.now() + _per(limits.c.per_s),
        )
        .returning(rate_limiter.c.rate_key)
    )


def rate_waits() -> Select[tuple[str, float]]:
    """Step 5, last in the claim's transaction: for each limiter of ``keys`` at its limit that
    still has a due job in ``queue``, the seconds from the database's clock now until it admits
    its next start (when its ``allowed``-th latest start leaves the window). Locks nothing more."""
    limits = _limits()
    queue = bindparam("queue", type_=Text)
    per = _per(limits.c.per_s)
    # starts is newest first: with `allowed` of them in the window, the allowed-th is the first
    # to leave it.
    nth = rate_limiter.c.starts[limits.c.allowed]
    due = exists().where(
        *rated_in(queue), job.c.rate_key == rate_limiter.c.rate_key, job.c.run_at <= func.now()
    )
    wait = cast(func.extract("epoch", nth + per - func.clock_timestamp()), Float)
    return (
        select(rate_limiter.c.rate_key, wait.label("wait"))
        .select_from(rate_limiter.join(limits, _kind_of(rate_limiter.c.rate_key) == limits.c.kind))
        .where(
            rate_limiter.c.rate_key == func.any(bindparam("keys", type_=ARRAY(Text))),
            _used(rate_limiter.c.starts, limits.c.per_s) >= limits.c.allowed,
            due,
        )
    )
