"""Job dependencies at enqueue: where each parent stands, and the edges of new children with
their first state. The release and the failure rule run in the database's triggers
(:mod:`sqla_jobs.model.workflows`), in the transaction that ends the parent.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Insert,
    Select,
    Table,
    bindparam,
    delete,
    func,
    insert,
    select,
    true,
)

from sqla_jobs.model import Dependency, JobOutcome
from sqla_jobs.sql.tables import ONE_MICROSECOND, job

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyDelete

__all__ = [
    "attach_children",
    "job_children",
    "job_parents",
    "parent_states",
    "prune_edges",
    "prune_outcomes",
]

dependency = typing.cast(Table, Dependency.__table__)
outcome = typing.cast(Table, JobOutcome.__table__)


def parent_states() -> Select[Any]:
    """For each id of ``parents`` (bigint[]): the id, its job's state (NULL: no row) and its
    recorded outcome (NULL: none). Locks nothing; served by the two primary keys."""
    parents = (
        func.unnest(bindparam("parents", type_=ARRAY(BigInteger())))
        .table_valued("id")
        .render_derived("parent")
    )
    return (
        select(parents.c.id, job.c.state, outcome.c.outcome)
        .select_from(
            parents.outerjoin(job, job.c.id == parents.c.id).outerjoin(
                outcome, outcome.c.id == parents.c.id
            )
        )
        .order_by(parents.c.id)
    )


def _relatives(mine: Any, theirs: Any) -> Select[Any]:
    # The other end of each edge of job ``id``: its row (if any) and its recorded outcome (if any).
    return (
        select(
            theirs.label("id"), dependency.c.run_anyway, job.c.kind, job.c.state, outcome.c.outcome
        )
        .select_from(
            dependency.outerjoin(job, job.c.id == theirs).outerjoin(outcome, outcome.c.id == theirs)
        )
        .where(mine == bindparam("id", type_=BigInteger))
        .order_by(theirs)
        .limit(bindparam("limit", type_=BigInteger))
    )


def job_parents() -> Select[Any]:
    """Up to ``limit`` parents of job ``id``, by id: the id, the edge's ``run_anyway``, the
    parent's kind and state (NULL: its row is gone) and its recorded outcome (NULL: none). For
    ``jobs show`` and the dashboard. No locks; served by ``sqla_jobs_dependency_child_id_idx``
    and the two primary keys."""
    return _relatives(dependency.c.child_id, dependency.c.parent_id)


def job_children() -> Select[Any]:
    """:func:`job_parents` the other way: up to ``limit`` children of job ``id``, by id, same
    columns. No locks; served by the dependency table's primary key (parent first)."""
    return _relatives(dependency.c.parent_id, dependency.c.child_id)


def attach_children() -> Insert:
    """Insert an edge from each of ``parents`` to each of ``children`` (bigint[] both, the
    children just inserted in this transaction), ``run_anyway`` on each. The table's statement
    trigger gives the children their first state (``waiting`` on their unfinished parents, or
    ``cancelled`` for a failed one) with its own rights, so the enqueuer needs no UPDATE on the
    job table, and refuses a child this transaction did not enqueue; the commit recounts (a
    parent may end meanwhile). Edges in (child, parent) order."""
    parents = (
        func.unnest(bindparam("parents", type_=ARRAY(BigInteger())))
        .table_valued("p")
        .render_derived("parent")
    )
    children = (
        func.unnest(bindparam("children", type_=ARRAY(BigInteger())))
        .table_valued("c")
        .render_derived("child")
    )
    return insert(dependency).from_select(
        ["parent_id", "child_id", "run_anyway"],
        select(parents.c.p, children.c.c, bindparam("run_anyway", type_=Boolean))
        .select_from(children.join(parents, true()))
        .order_by(children.c.c, parents.c.p),
    )


def prune_edges() -> AnyDelete:
    """Delete up to ``limit`` edges whose child has left the job table (completed and deleted,
    or pruned): nothing reads them any more (a release looks for waiting children, a listing
    for rows). No row lock before the delete (``FOR UPDATE`` needs the UPDATE privilege, which
    the worker's role has not on this table; pruners take turns on an advisory lock anyway);
    an edge of a child not yet committed is not visible, so never taken. The number deleted is
    the cursor's row count."""
    gone = (
        select(dependency.c.parent_id, dependency.c.child_id)
        .where(~select(job.c.id).where(job.c.id == dependency.c.child_id).exists())
        .limit(bindparam("limit", type_=BigInteger))
        .subquery("gone")
    )
    return (
        delete(dependency)
        .where(dependency.c.parent_id == gone.c.parent_id)
        .where(dependency.c.child_id == gone.c.child_id)
        .returning(dependency.c.child_id)
    )


def prune_outcomes() -> AnyDelete:
    """Delete up to ``limit`` recorded outcomes of parents that ended more than
    ``older_than_us`` microseconds ago (the retention of dead jobs), oldest first; the number
    deleted is the cursor's row count. Locks only the rows it deletes (``SKIP LOCKED``); served
    by ``sqla_jobs_outcome_finished_at_idx``. A child enqueued later on such a parent gets a
    :class:`~sqla_jobs.DependencyError`."""
    picked = (
        select(outcome.c.id)
        .where(
            outcome.c.finished_at
            < func.now() - bindparam("older_than_us", type_=BigInteger) * ONE_MICROSECOND
        )
        .order_by(outcome.c.finished_at)
        .limit(bindparam("limit", type_=BigInteger))
        .with_for_update(skip_locked=True)
    )
    return (
        delete(outcome)
        .where(outcome.c.id == func.any(func.array(picked.scalar_subquery())))
        .returning(outcome.c.id)
    )
