"""The operations on jobs: retry, cancel, delete, get a job; in the caller's Session (a queue's
pause: :mod:`sqla_jobs.operations.queues`).

Like enqueue, they ride the caller's transaction: nothing happens unless it commits, and a
rollback undoes all of it; workers hear of a cancel or a retried job at commit (NOTIFY). Given
explicit ids, an operation first locks those jobs and checks them all: an unknown id or a job in a
state the operation does not apply to raises before anything changed, and the transaction stays
usable. Given a SELECT of job ids (the jobs linked to a row of the application's), it is a filter,
as ``kind`` and ``queue`` are: it applies to the jobs among them in a state it applies to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import Executable

from sqla_jobs.errors import (
    InvalidQueueNameError,
    JobNotFoundError,
    JobReferencedError,
    JobStateError,
    UniqueKeyTakenError,
)
from sqla_jobs.kinds import check_name
from sqla_jobs.model import Job, JobState
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import operations as operations_sql
from sqla_jobs.sql import unique as unique_sql

#: Jobs one operation by filter touches at most (a bigger backlog: call it again).
FILTER_LIMIT = 10_000
#: NOTIFY payloads stay under PostgreSQL's 8,000 bytes: job ids a cancel notification carries.
_IDS_PER_NOTIFY = 500

_LOCK = operations_sql.lock_jobs()
_FIND = operations_sql.find_jobs()
_FIND_AMONG = operations_sql.find_jobs_among()
_RETRY = operations_sql.retry_jobs()
_HOLDERS = unique_sql.unique_holders()
_CANCEL_PENDING = operations_sql.cancel_pending()
_REQUEST_CANCEL = operations_sql.request_cancel()
_DELETE = operations_sql.delete_jobs()
_NOTIFY = enqueue_sql.notify()

RETRYABLE = (JobState.DEAD.value, JobState.CANCELLED.value, JobState.PENDING.value)
CANCELLABLE = (JobState.PENDING.value, JobState.RUNNING.value, JobState.WAITING.value)
DELETABLE = (JobState.DEAD.value, JobState.CANCELLED.value, JobState.COMPLETED.value)
#: The states an operation by filter selects, by operation: what it runs on and what a count of
#: it (:mod:`sqla_jobs.operations.preview`) counts.
FILTER_STATES = {
    "retry": (JobState.DEAD.value,),
    "delete": (JobState.DEAD.value,),
    "cancel": CANCELLABLE,
}

#: What an operation is given: job ids (each must exist, in a state the operation applies to), a
#: query of job ids (a SELECT, a UNION, a text(): a filter), or None (``kind`` and ``queue`` alone).
Ids = Sequence[int] | Executable | None


@dataclass(frozen=True)
class CancelResult:
    """What :meth:`Jobs.cancel <sqla_jobs.Jobs.cancel>` did: pending jobs ``cancelled`` (they
    will never run), and running jobs whose worker was asked to stop them (``requested``: they end
    ``cancelled`` when the handler stops, or ``completed`` if it returns normally anyway)."""

    cancelled: list[int] = field(default_factory=list)
    requested: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Bound:
    """What an operation by filter may touch at most, when an operator confirmed a count: the
    jobs with ids up to ``max_id``, ``limit`` of them (at most :data:`FILTER_LIMIT`), and with
    ``ids`` only those jobs. A job that matches the filter after the count is left alone; one
    counted that no longer matches is skipped."""

    max_id: int | None = None
    limit: int = FILTER_LIMIT
    ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Scope:
    """The schema and channels of one ``Jobs``, as the operations need them."""

    schema: str | None
    channel: str
    cancel_channel: str

    @property
    def options(self) -> dict[str, Any]:
        if self.schema is None:
            return {}
        return {"schema_translate_map": {None: self.schema}}


def _targets(
    session: Session,
    scope: Scope,
    ids: Ids,
    allowed: tuple[str, ...],
    filter_states: tuple[str, ...],
    what: str,
    kind: str | None,
    queue: str | None,
    bound: Bound | None = None,
) -> list[Any]:
    """The jobs an operation applies to, locked: ``ids`` checked (all exist, all in ``allowed``
    states), or those in ``filter_states`` matching ``kind`` and ``queue`` (and among the ids a
    SELECT ``ids`` returns)."""
    if ids is None or isinstance(ids, Executable):
        if queue is not None:
            _check_queue(queue)
        bound = bound or Bound()
        params: dict[str, Any] = {
            "states": list(filter_states),
            "kind": kind,
            "queue": queue,
            "max_id": bound.max_id,
            "limit": min(bound.limit, FILTER_LIMIT),
        }
        find = _FIND
        if ids is not None:
            # The application's own query, run as written: its tables are its own, so the
            # schema_translate_map that places the job table must not touch them.
            params["ids"] = sorted({int(i) for i in session.scalars(ids) if i is not None})
            find = _FIND_AMONG
        if bound.ids is not None:
            among = set(bound.ids) if ids is None else set(bound.ids) & set(params["ids"])
            params["ids"] = sorted(among)
            find = _FIND_AMONG
        return list(session.execute(find, params, execution_options=scope.options))
    wanted = sorted({int(i) for i in ids})
    rows = list(session.execute(_LOCK, {"ids": wanted}, execution_options=scope.options))
    missing = sorted(set(wanted) - {r[0] for r in rows})
    if missing:
        raise JobNotFoundError(f"no job with id {_list(missing)}: nothing changed", missing)
    wrong = {r[0]: r[1] for r in rows if r[1] not in allowed}
    if wrong:
        states = ", ".join(f"job {i} is {s}" for i, s in sorted(wrong.items()))
        raise JobStateError(
            f"cannot {what}: {states} ({what} applies to {', '.join(allowed)} jobs): "
            "nothing changed",
            wrong,
        )
    return rows


@dataclass(frozen=True)
class RetryResult:
    """What :func:`retry_detail` did: the jobs ``retried``, and those a retry by filter ``kept``
    as they were because another job holds their unique key (by job, that job)."""

    retried: list[int] = field(default_factory=list)
    kept: dict[int, int] = field(default_factory=dict)


def _is_filter(ids: Ids) -> bool:
    return ids is None or isinstance(ids, Executable)


def retry(
    session: Session,
    scope: Scope,
    ids: Ids = None,
    *,
    kind: str | None = None,
    queue: str | None = None,
) -> list[int]:
    """Run dead, cancelled or not-yet-due pending jobs again as soon as possible, both budgets
    whole again; without ``ids``, the dead jobs of ``kind`` and ``queue``. Returns the ids."""
    return retry_detail(session, scope, ids, kind=kind, queue=queue).retried


def retry_detail(
    session: Session,
    scope: Scope,
    ids: Ids = None,
    *,
    kind: str | None = None,
    queue: str | None = None,
    bound: Bound | None = None,
) -> RetryResult:
    """:func:`retry`, saying which jobs a retry by filter kept because of their unique key; a
    retry by filter touches only jobs within ``bound`` when it is given."""
    rows = _targets(
        session, scope, ids, RETRYABLE, FILTER_STATES["retry"], "retry", kind, queue, bound
    )
    if not rows:
        return RetryResult()
    targets = [r[0] for r in rows]
    if any(r[4] for r in rows):
        held = _held_keys(session, scope, targets)
        if held and not _is_filter(ids):
            taken = ", ".join(f"job {i}'s is held by job {h}" for i, h in sorted(held.items()))
            raise UniqueKeyTakenError(
                f"cannot retry: a unique key is taken ({taken}): nothing changed", held
            )
        targets = [i for i in targets if i not in held]
    else:
        held = {}
    done = (
        list(session.execute(_RETRY, {"ids": targets}, execution_options=scope.options))
        if targets
        else []
    )
    _wake(session, scope, {r[1] for r in done})
    return RetryResult(sorted(r[0] for r in done), held)


def _held_keys(session: Session, scope: Scope, ids: list[int]) -> dict[int, int]:
    """Of the unique jobs ``ids`` (locked), those a retry would put in a unique key's way: the
    key is held by another job now, or shared with a lower id of ``ids`` (that one is retried).
    By job, the job in its way. Locked rows cannot change; a job enqueued with one of these keys
    after this check waits for this transaction (its insert waits on the index entry)."""
    held: dict[int, int] = {}
    for i, other, holds in session.execute(_HOLDERS, {"ids": ids}, execution_options=scope.options):
        if (holds or other < i) and i not in held:
            held[i] = other
    return dict(sorted(held.items()))


def cancel(
    session: Session,
    scope: Scope,
    ids: Ids = None,
    *,
    kind: str | None = None,
    queue: str | None = None,
    bound: Bound | None = None,
) -> CancelResult:
    """Cancel pending jobs, and ask the workers running running ones to stop them; without
    ``ids``, the pending and running jobs of ``queue`` and ``kind`` (within ``bound``)."""
    rows = _targets(
        session, scope, ids, CANCELLABLE, FILTER_STATES["cancel"], "cancel", kind, queue, bound
    )
    pending = [r[0] for r in rows if r[1] != JobState.RUNNING.value]
    running = [r[0] for r in rows if r[1] == JobState.RUNNING.value]
    options = scope.options
    cancelled = (
        [
            r[0]
            for r in session.execute(_CANCEL_PENDING, {"ids": pending}, execution_options=options)
        ]
        if pending
        else []
    )
    requested = (
        [
            r[0]
            for r in session.execute(_REQUEST_CANCEL, {"ids": running}, execution_options=options)
        ]
        if running
        else []
    )
    for start in range(0, len(requested), _IDS_PER_NOTIFY):
        payload = ",".join(map(str, requested[start : start + _IDS_PER_NOTIFY]))
        session.execute(_NOTIFY, {"channel": scope.cancel_channel, "queue": payload})
    return CancelResult(cancelled=sorted(cancelled), requested=sorted(requested))


def delete(
    session: Session,
    scope: Scope,
    ids: Ids = None,
    *,
    kind: str | None = None,
    queue: str | None = None,
    bound: Bound | None = None,
) -> list[int]:
    """Delete finished jobs (dead, cancelled, or kept ``completed``); without ``ids``, the dead
    jobs of ``kind`` and ``queue`` (within ``bound``). Returns the ids deleted."""
    rows = _targets(
        session, scope, ids, DELETABLE, FILTER_STATES["delete"], "delete", kind, queue, bound
    )
    if not rows:
        return []
    targets = [r[0] for r in rows]
    params = {"ids": targets, "states": list(DELETABLE)}
    try:
        # A savepoint: an application's foreign key to one of them must not abort the caller's
        # transaction, only this delete.
        with session.begin_nested():
            done = session.execute(_DELETE, params, execution_options=scope.options)
            return sorted(r[0] for r in done)
    except IntegrityError as exc:
        diag = getattr(exc.orig, "diag", None)
        detail = str(getattr(diag, "message_detail", None) or exc.orig).strip()
        raise JobReferencedError(
            f"cannot delete: a job is still referenced by a row of the application ({detail}): "
            "nothing changed",
            targets,
            detail,
        ) from None


def get(session: Session, scope: Scope, job_id: int) -> Job | None:
    """The job ``job_id`` as the caller's transaction sees it, or None."""
    return session.get(Job, job_id, execution_options=scope.options)


def _wake(session: Session, scope: Scope, queues: set[str]) -> None:
    # Delivered at commit, like enqueue's: workers claim what was just made claimable.
    for queue in sorted(queues):
        session.execute(_NOTIFY, {"channel": scope.channel, "queue": queue})


def _check_queue(queue: str) -> None:
    try:
        check_name("queue", queue)
    except ValueError as exc:
        raise InvalidQueueNameError(str(exc)) from None


def _list(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:10]))
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def said(verb: str, ids: Sequence[int], what: str = "job") -> str:
    """``retried 3 jobs: 4, 5, 6``."""
    noun = what if len(ids) == 1 else f"{what}s"
    return f"{verb} {len(ids)} {noun}: {', '.join(map(str, ids))}"


#: What a cancel request does to a running job, said after the jobs it asked about.
RUNNING_CANCEL_NOTE = (
    " (an async handler is cancelled at once and the job ends cancelled; a sync handler is told "
    "through ctx.cancelled: its job ends cancelled if it stops by raising, and completes if it "
    "returns)"
)
