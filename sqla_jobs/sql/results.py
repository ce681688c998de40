"""Job results: the completion of a kind with ``results=True``, which stores what its handler
returned in ``sqla_jobs_outcome`` in the same statement as it deletes the job; and the reads of
stored results (a child's parents', one job's).

Jobs of other kinds complete with :func:`~sqla_jobs.sql.outcomes.complete` as before: a kind that
stores nothing pays nothing.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Select,
    Table,
    Text,
    bindparam,
    cast,
    column,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs.model import Dependency, JobOutcome
from sqla_jobs.sql.outcomes import _HISTORY_COLUMNS, _claimed_by, _end_held_run
from sqla_jobs.sql.tables import COMPLETED, history, job

if TYPE_CHECKING:
    from sqlalchemy import CTE

    from sqla_jobs.sql.tables import AnyInsert

__all__ = [
    "complete_into_history_with_results",
    "complete_with_results",
    "job_result",
    "keep_completed_with_result",
    "parent_results",
]

dependency = typing.cast(Table, Dependency.__table__)
outcome = typing.cast(Table, JobOutcome.__table__)


def _recorded(done: CTE, one: bool = False) -> CTE:
    # The outcome rows of the jobs ``done`` deleted, each with its entry of ``results`` (JSON
    # text, parallel to ``ids``). An upsert: the outcome trigger of a job with dependents writes
    # the same row (after this statement, or before it in the same transaction) and leaves the
    # result alone.
    given = (
        func.unnest(
            bindparam("ids", type_=ARRAY(BigInteger())),
            bindparam("results", type_=ARRAY(Text())),
        )
        .table_valued(column("id", BigInteger), column("result", Text))
        .render_derived("given")
    )
    rows = select(given.c.id, COMPLETED, func.now(), cast(given.c.result, JSONB)).where(
        given.c.id.in_(select(done.c.id))
    )
    if one:  # job ``job_id``'s ``result``
        rows = select(
            done.c.id, COMPLETED, func.now(), cast(bindparam("result", type_=Text), JSONB)
        )
    upsert = pg_insert(outcome).from_select(["id", "outcome", "finished_at", "result"], rows)
    upsert = upsert.on_conflict_do_update(
        index_elements=[outcome.c.id], set_={"result": upsert.excluded.result}
    )
    return upsert.returning(outcome.c.id).cte("recorded")


def complete_with_results() -> Select[Any]:
    """:func:`~sqla_jobs.sql.outcomes.complete` for jobs whose kind stores results: delete the
    finished jobs ``ids`` of the claim ``token`` whose lease it still holds, and store each
    deleted job's entry of ``results`` (JSON text, parallel to ``ids``) as its completed outcome,
    in one statement. Returns the deleted ids. Served by the two primary keys."""
    done = _delete_held(("id",))
    return select(done.c.id).add_cte(_recorded(done))


def complete_into_history_with_results() -> AnyInsert:
    """:func:`complete_with_results`, and copy each deleted job into ``sqla_jobs_history`` as
    :func:`~sqla_jobs.sql.outcomes.complete_into_history` does; returns the ids kept."""
    done = _delete_held(_HISTORY_COLUMNS)
    return (
        insert(history)
        .from_select(list(_HISTORY_COLUMNS), select(*[done.c[c] for c in _HISTORY_COLUMNS]))
        .returning(history.c.id)
        .add_cte(_recorded(done))
    )


def keep_completed_with_result() -> Select[Any]:
    """:func:`~sqla_jobs.sql.outcomes.keep_completed_in_session` (job ``job_id``, lease
    ``token``, ``error``) for a kind that stores results: the row kept ``completed`` and
    ``result`` (JSON text) stored as its outcome, in one statement. Returns the id (no row: the
    lease was lost). Served by the two primary keys."""
    kept = _end_held_run(COMPLETED, "job_id").cte("done")
    return select(kept.c.id).add_cte(_recorded(kept, one=True))


def _delete_held(columns: tuple[str, ...]) -> CTE:
    return job.delete().where(_claimed_by()).returning(*[job.c[c] for c in columns]).cte("done")


def parent_results() -> Select[Any]:
    """The stored result of each parent of job ``child`` that has one: (parent id, result as
    JSON text, whatever the connection's jsonb loader). Locks nothing; served by the edges'
    child index and the outcomes' primary key."""
    return (
        select(dependency.c.parent_id, cast(outcome.c.result, Text))
        .join(outcome, outcome.c.id == dependency.c.parent_id)
        .where(dependency.c.child_id == bindparam("child", type_=BigInteger))
        .where(outcome.c.result.is_not(None))
        .order_by(dependency.c.parent_id)
    )


def job_result() -> Select[Any]:
    """The stored result of job ``job_id``, and whether there is one (no row, or SQL NULL: none
    stored; JSON ``null`` is a result). Locks nothing; served by the primary key."""
    return select(outcome.c.result, outcome.c.result.is_not(None).label("stored")).where(
        outcome.c.id == bindparam("job_id", type_=BigInteger)
    )
