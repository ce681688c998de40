"""A job's place in a graph of dependencies, as ``jobs show`` and the dashboard's job page print
it: its parents and children, each with its state, or for a row that is gone the outcome its
end recorded (``sqla_jobs_outcome``), else ``gone``. Reads only, in the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from sqla_jobs.sql import workflows as workflows_sql

__all__ = ["Relative", "Relatives", "relatives"]

_PARENTS = workflows_sql.job_parents()
_CHILDREN = workflows_sql.job_children()

#: Parents or children listed per side; a fan-out past it is cut (``more`` says so).
LIMIT = 100


@dataclass(frozen=True)
class Relative:
    """One parent or child: its id, kind (None: its row is gone), and where it stands."""

    id: int
    kind: str | None
    #: The row's state, else the recorded outcome, else ``gone``.
    state: str
    #: False: the row is gone and ``state`` is what its end recorded (or ``gone``).
    present: bool
    #: The child runs even if this parent fails (``on_parent_failure="run"``).
    run_anyway: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "state": self.state,
            "present": self.present,
            "run_anyway": self.run_anyway,
        }


@dataclass(frozen=True)
class Relatives:
    """The parents and children of one job, by id, at most :data:`LIMIT` each."""

    parents: list[Relative]
    children: list[Relative]
    #: True: the job has more parents (or children) than listed.
    more_parents: bool = False
    more_children: bool = False


def _read(session: Session, stmt: Any, job_id: int, options: dict[str, Any]) -> list[Relative]:
    rows = session.execute(stmt, {"id": job_id, "limit": LIMIT + 1}, execution_options=options)
    return [
        Relative(
            id=r.id,
            kind=r.kind,
            state=r.state or r.outcome or "gone",
            present=r.state is not None,
            run_anyway=bool(r.run_anyway),
        )
        for r in rows
    ]


def relatives(session: Session, schema: str | None, job_id: int) -> Relatives:
    """The parents and children of job ``job_id`` (none for a job outside every graph), read in
    ``session``'s transaction from the tables of ``schema``. Two index reads, no locks."""
    options = {} if schema is None else {"schema_translate_map": {None: schema}}
    parents = _read(session, _PARENTS, job_id, options)
    children = _read(session, _CHILDREN, job_id, options)
    return Relatives(
        parents=parents[:LIMIT],
        children=children[:LIMIT],
        more_parents=len(parents) > LIMIT,
        more_children=len(children) > LIMIT,
    )
