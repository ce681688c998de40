"""A queue's pause, in the caller's Session: pause, resume, forget its row, and which queues the
database knows of (so that a typo is refused rather than paused into existence).

As the job operations do, these ride the caller's transaction: nothing happens unless it commits;
workers hear of a resumed queue at commit (NOTIFY). A refusal (``OperationError``) comes before
the first write and leaves the transaction usable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from sqla_jobs.errors import InvalidQueueNameError, QueueInUseError, UnknownQueueError
from sqla_jobs.kinds import check_name
from sqla_jobs.operations.jobs import Scope
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import listings as listings_sql
from sqla_jobs.sql import queues as queues_sql

_PAUSE = queues_sql.pause_queue()
_RESUME = queues_sql.resume_queue()
_READ = queues_sql.read_queue_state()
_FORGET = queues_sql.forget_queue()
_KNOWN = queues_sql.known_queues()
_STORED = listings_sql.list_queue_states()
_NOTIFY = enqueue_sql.notify()


@dataclass(frozen=True)
class QueueChange:
    """What :meth:`Jobs.pause_queue <sqla_jobs.Jobs.pause_queue>` or :meth:`~sqla_jobs.Jobs.resume_queue`
    did to ``queue``: ``paused_at`` is since when it is paused after the call (None: active), and
    ``changed`` whether the call changed it (False: it was paused, or active, already)."""

    queue: str
    paused_at: datetime | None
    changed: bool


def pause(session: Session, scope: Scope, queue: str, *, known_only: bool = False) -> QueueChange:
    """Pause ``queue`` for every worker; a queue paused already keeps its first time. With
    ``known_only``, a queue that is not paused and that :func:`known` does not list is refused
    (:class:`UnknownQueueError`) before anything changed."""
    _check(queue)
    if known_only:
        row = session.execute(_READ, {"name": queue}, execution_options=scope.options).first()
        if row is None:
            names = known(session, scope)
            if queue not in names:
                listed = ", ".join(names) if names else "none"
                raise UnknownQueueError(
                    f"unknown queue {queue!r}: no pending, running or recent job, schedule or live "
                    "worker names it "
                    f"(known queues: {listed}): nothing changed",
                    queue,
                    names,
                )
    paused_at = session.execute(
        _PAUSE, {"name": queue}, execution_options=scope.options
    ).scalar_one_or_none()
    if paused_at is not None:
        return QueueChange(queue, paused_at, True)
    since = session.execute(_READ, {"name": queue}, execution_options=scope.options).scalar_one()
    return QueueChange(queue, since, False)


def resume(session: Session, scope: Scope, queue: str) -> QueueChange:
    """Let workers claim from ``queue`` again, woken at commit; a queue that is not paused is left
    as it is (no row is created for it)."""
    _check(queue)
    done = session.execute(_RESUME, {"name": queue}, execution_options=scope.options).first()
    if done is not None:
        # Delivered at commit, like enqueue's: workers claim what was just made claimable.
        session.execute(_NOTIFY, {"channel": scope.channel, "queue": queue})
    return QueueChange(queue, None, done is not None)


def forget(session: Session, scope: Scope, queue: str, *, force: bool = False) -> bool:
    """Delete ``queue``'s row. Refused (:class:`QueueInUseError`) when the queue is paused and
    jobs, a schedule or a live worker still name it (:func:`known` without the stored rows), since forgetting would resume it, unless
    ``force`` (then its workers are woken at commit). Returns whether there was a row."""
    _check(queue)
    row = session.execute(_READ, {"name": queue}, execution_options=scope.options).first()
    if row is None:
        return False
    paused = row.paused_at is not None
    if paused and not force and queue in _in_use(session, scope):
        raise QueueInUseError(
            f"queue {queue!r} is paused and still in use (jobs, a schedule or a live worker name "
            "it): forgetting its row would resume it, so nothing changed",
            queue,
        )
    session.execute(_FORGET, {"name": queue}, execution_options=scope.options)
    if paused:
        session.execute(_NOTIFY, {"channel": scope.channel, "queue": queue})
    return True


def known(session: Session, scope: Scope) -> list[str]:
    """The queues the database knows of, by name: those in use
    (:func:`sqla_jobs.sql.queues.known_queues`) and those with a stored row."""
    stored = session.execute(_STORED, execution_options=scope.options).scalars()
    return sorted(set(_in_use(session, scope)) | set(stored))


def _in_use(session: Session, scope: Scope) -> list[str]:
    return list(session.execute(_KNOWN, execution_options=scope.options).scalars())


def _check(queue: str) -> None:
    try:
        check_name("queue", queue)
    except ValueError as exc:
        raise InvalidQueueNameError(str(exc)) from None
