"""The rate limiters' rows outside a claim: created for keys seen for the first time
(:func:`create_rate_limiters`), listed for an operator (:func:`list_rate_limiters`), and deleted
by the pruner once idle (:func:`prune_rate_limiters`). The claim's statements are
:mod:`~sqla_jobs.sql.rate_limits`'.
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
    case,
    cast,
    delete,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs.sql.tables import rate_limiter

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyDelete

__all__ = ["create_rate_limiters", "list_rate_limiters", "prune_rate_limiters"]


def create_rate_limiters() -> Insert:
    """The limiters ``keys`` (in key order, so two of these never wait on each other in a
    cycle), with an empty log; a key that has one already is left as it is (it may wait for the
    transaction that is creating it). Run on its own, outside a claim's transaction."""
    keys = func.unnest(bindparam("keys", type_=ARRAY(Text))).table_valued("key").render_derived()
    rows = select(keys.c.key).order_by(keys.c.key)
    return (
        pg_insert(rate_limiter)
        .from_select([rate_limiter.c.rate_key], rows)
        .on_conflict_do_nothing(index_elements=[rate_limiter.c.rate_key])
    )


def list_rate_limiters() -> Select[Any]:
    """Every limiter a claim has written, by key: (rate_key, allowed, per in seconds, the starts
    in the window now, the seconds until it admits its next start (0: it has room now), its
    latest start), with the limit its last claim applied. A plain read of the limiter table, no
    locks; the window is counted by the database's clock now."""
    per = rate_limiter.c.per
    in_window = func.unnest(rate_limiter.c.starts).table_valued("s").render_derived(name="logged")
    used = (
        select(func.count())
        .select_from(in_window)
        .where(in_window.c.s > func.now() - per)
        .scalar_subquery()
    )
    # starts is newest first: at the limit, the allowed-th start is the first to leave it.
    nth = rate_limiter.c.starts[rate_limiter.c.allowed]
    wait = case(
        (used >= rate_limiter.c.allowed, func.extract("epoch", nth + per - func.now())),
        else_=0,
    )
    return (
        select(
            rate_limiter.c.rate_key,
            rate_limiter.c.allowed,
            cast(func.extract("epoch", per), Float).label("per_seconds"),
            used.label("used"),
            cast(func.greatest(wait, 0), Float).label("next_in"),
            rate_limiter.c.starts[1].label("latest"),
        )
        .where(rate_limiter.c.allowed.is_not(None))
        .order_by(rate_limiter.c.rate_key)
    )


def prune_rate_limiters() -> AnyDelete:
    """Delete up to ``limit`` limiters idle for their whole window (past ``free_at``: their log
    limits nothing), skipping any a claim holds now; returns their keys. The next claim of a key
    makes its row again, with an empty log, which is exact: none of the deleted starts counted."""
    idle = (
        select(rate_limiter.c.rate_key)
        .where(rate_limiter.c.free_at < func.now())
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        delete(rate_limiter)
        .where(rate_limiter.c.rate_key == func.any(func.array(idle)))
        .returning(rate_limiter.c.rate_key)
    )
