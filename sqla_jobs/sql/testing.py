"""The selection of :mod:`sqla_jobs.testing`: only the jobs the test's own transaction wrote, due by
a clock the test moves forward without sleeping. The testing claims themselves are composed in
:mod:`~sqla_jobs.sql.claim`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Select,
    Text,
    bindparam,
    func,
    literal_column,
    or_,
    select,
)

from sqla_jobs.model import (
    DEPENDENCY_TABLE,
    OUTCOME_TABLE,
    Job,
    JobOutcome,
)
from sqla_jobs.sql.tables import (
    ONE_MICROSECOND,
    PENDING,
    job,
)

__all__ = [
    "WRITTEN_HERE",
    "count_unsettled",
    "due_for_testing",
    "find_pending_for_testing",
    "settle_dependencies",
    "this_test",
]


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


def this_test() -> ColumnElement[bool]:
    """Every job with ``all_jobs``, else only those the current transaction wrote."""
    # Every job when ``all_jobs``, else only this transaction's.
    return or_(bindparam("all_jobs", False, type_=Boolean), WRITTEN_HERE)


def due_for_testing() -> tuple[ColumnElement[bool], ...]:
    """A test's selection: due by a clock moved ``ahead_us`` (or any time), and its own jobs."""
    # Due by now() + ``ahead_us`` microseconds (time moved forward without sleeping), or at any
    # time with ``delayed``; the outcomes still compute run_at from the real now().
    return (
        or_(
            bindparam("delayed", False, type_=Boolean),
            job.c.run_at
            <= func.now() + bindparam("ahead_us", 0, type_=BigInteger) * ONE_MICROSECOND,
        ),
        this_test(),
    )


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
            this_test(),
        )
        .order_by(job.c.id)
    )


def count_unsettled() -> Select[Any]:
    """How many parents that ended in this transaction have children not settled yet (their
    outcome is ``unsettled`` until the deferred trigger runs). Served by the partial index
    ``sqla_jobs_outcome_unsettled_idx``: a handful of rows, no locks."""
    outcome = JobOutcome.__table__
    return select(func.count()).select_from(outcome).where(outcome.c.unsettled)


def settle_dependencies(schema: str | None) -> tuple[str, str]:
    """Two statements that run the dependency triggers deferred to commit now, then defer them
    again: a test's transaction never commits, so without them no child is ever released or
    cancelled, nor its edges recounted. The second statement keeps the rest of the transaction
    as a commit would see it (a child's check must follow the statement trigger that gives it
    its first state)."""
    q = "" if schema is None else f'"{schema}".'
    names = f"{q}{OUTCOME_TABLE}_settle, {q}{DEPENDENCY_TABLE}_check"
    return f"SET CONSTRAINTS {names} IMMEDIATE", f"SET CONSTRAINTS {names} DEFERRED"
