"""``depends_on`` at enqueue: the parents checked (pure), where each stands (one SELECT before
anything is written, so an unknown parent raises with the transaction usable), and the new
children's edges and first state (one statement after their insert).

What happens afterwards runs in the database (:mod:`sqla_jobs.model.workflows`): the commit of
the enqueuing transaction marks the parents and recounts them, and each parent's end releases or
cancels its children in its own transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from sqla_jobs.errors import DependencyError, InvalidOptionError
from sqla_jobs.model import Job, JobState
from sqla_jobs.sql import workflows as workflows_sql

#: What a child does when a parent ends dead, cancelled or deleted: ``"cancel"`` (the default:
#: it is cancelled, and its own dependents after it) or ``"run"`` (that parent counts as done).
OnParentFailure = Literal["cancel", "run"]
ON_PARENT_FAILURE: tuple[str, ...] = get_args(OnParentFailure)
#: The most parents one enqueue may name.
MAX_PARENTS = 10_000
DependsArg = Iterable["Job | int"] | None

_UNFINISHED = {JobState.PENDING.value, JobState.RUNNING.value, JobState.WAITING.value}
_FAILED = {JobState.DEAD.value, JobState.CANCELLED.value, "deleted"}
_PARENT_STATES = workflows_sql.parent_states()
_ATTACH = workflows_sql.attach_children()


@dataclass(frozen=True)
class Depends:
    """Checked ``depends_on``: the parents' ids (sorted, once each) and whether a failed parent
    lets the child run."""

    parents: tuple[int, ...]
    run_anyway: bool


@dataclass(frozen=True)
class Start:
    """Where new children start, from their parents' states when they are enqueued."""

    state: str
    waiting_on: int
    failed_parent: int | None = None
    failed_outcome: str | None = None


def check(depends_on: DependsArg, on_parent_failure: str) -> Depends | None:
    """The checked ``depends_on`` (None for none), or :class:`InvalidOptionError`; no I/O. A
    ``Job`` must have its id (flushed: every enqueue returns one that has)."""
    if on_parent_failure not in ON_PARENT_FAILURE:
        raise InvalidOptionError(
            f"on_parent_failure must be one of {', '.join(ON_PARENT_FAILURE)}, got "
            f"{on_parent_failure!r}"
        )
    if depends_on is None:
        return None
    if isinstance(depends_on, (str, bytes, Job, int)):
        raise InvalidOptionError(
            "depends_on takes a list of jobs or job ids, got a single "
            f"{type(depends_on).__qualname__}"
        )
    ids: set[int] = set()
    for parent in depends_on:
        found = _id_of(parent) if isinstance(parent, Job) else parent
        if isinstance(found, bool) or not isinstance(found, int) or found < 1:
            raise InvalidOptionError(
                "depends_on takes Job objects with an id (flush them first) or positive int "
                f"job ids, got {parent!r}"
            )
        ids.add(found)
    if len(ids) > MAX_PARENTS:
        raise InvalidOptionError(f"depends_on names {len(ids)} jobs, over {MAX_PARENTS}")
    if not ids:
        return None
    return Depends(tuple(sorted(ids)), on_parent_failure == "run")


def _id_of(job: Job) -> object:
    """A ``Job``'s id without SQL: its identity key, which an expired ``Job`` (its Session
    committed) and a detached one keep; else what a pending one holds."""
    key = instance_state(job).key
    return key[1][0] if key is not None else job.__dict__.get("id")


def start_of(rows: Sequence[tuple[int, str | None, str | None]], run_anyway: bool) -> Start:
    """The children's first state from their parents' (id, job state, recorded outcome) rows;
    :class:`DependencyError` for a parent that is neither a job nor a recorded outcome."""
    unknown = [pid for pid, state, ended in rows if state is None and ended is None]
    if unknown:
        raise DependencyError(
            f"depends_on names job(s) {', '.join(map(str, unknown[:10]))} that do not exist and "
            "whose outcome is not known (never enqueued, or finished with nobody depending on it "
            "and pruned); a job can depend only on jobs that exist when it is enqueued",
            job_ids=unknown,
        )
    unfinished = 0
    for pid, state, ended in rows:
        where = state or ended
        if where in _UNFINISHED:
            unfinished += 1
        elif where in _FAILED and not run_anyway:
            return Start(JobState.CANCELLED.value, 0, pid, where)
    return Start(JobState.WAITING.value if unfinished else JobState.PENDING.value, unfinished)


def _options(schema: str | None) -> dict[str, Any]:
    return {} if schema is None else {"schema_translate_map": {None: schema}}


def resolve(session: Session, deps: Depends, schema: str | None) -> Start:
    """Read where ``deps``' parents stand (one SELECT, nothing locked) and return the children's
    first state, or raise :class:`DependencyError` with nothing written."""
    conn = session.connection(bind_arguments={"mapper": Job})
    rows = conn.execute(
        _PARENT_STATES, {"parents": list(deps.parents)}, execution_options=_options(schema)
    ).all()
    return start_of([(r[0], r[1], r[2]) for r in rows], deps.run_anyway)


def attach(
    session: Session,
    children: Sequence[int],
    deps: Depends,
    schema: str | None,
) -> None:
    """Insert the edges of the new ``children``; the table's trigger gives them their first
    state, as :func:`resolve`'s :class:`Start` says unless a parent ended since it was read (the
    commit recounts: see :mod:`sqla_jobs.model.workflows`)."""
    if not children:
        return
    conn = session.connection(bind_arguments={"mapper": Job})
    conn.execute(
        _ATTACH,
        {"parents": list(deps.parents), "children": list(children), "run_anyway": deps.run_anyway},
        execution_options=_options(schema),
    )


def mark(session: Session, job: Job, start: Start) -> None:
    """Show ``start`` on the ``Job`` enqueue returns (built without loading the row)."""
    set_committed_value(job, "state", start.state)
    set_committed_value(
        job, "waiting_on", start.waiting_on if start.state == JobState.WAITING.value else None
    )
    if start.state == JobState.CANCELLED.value:
        session.expire(job, ["finished_at", "last_error", "errors"])
