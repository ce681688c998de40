"""When an enqueue wakes the workers: the three wakeup modes of :class:`~sqla_jobs.Jobs`.

``"after_commit"`` (default)
    The queues to wake are kept with the Session's transaction and handed to the process's
    :mod:`notifier <sqla_jobs.enqueue.notifier>` once the Session's root transaction has committed; a
    rolled-back savepoint drops the ones enqueued inside it. A Session bound to a ``Connection``
    (whose transaction the caller, not the Session, may own: ``join_transaction_mode``) cannot
    know when the real commit happens, so there the NOTIFY rides the transaction, as below.
``"in_transaction"``
    ``pg_notify`` in the enqueuing transaction (delivered only if it commits), at most once per
    queue every :data:`THROTTLE` seconds per process, as River does: busy queues do not make every
    commit take the notification lock, at the price of the poll floor for some jobs.
``"none"``
    No wakeup: workers find jobs by polling.

In every mode only a job due now wakes anyone to claim: a job with a delay or a future ``run_at``
is announced with its time instead, in ``"after_commit"`` mode only (:mod:`~sqla_jobs.enqueue.due`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, get_args

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, SessionTransaction

from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.enqueue import notifier as _notifier
from sqla_jobs.model import Job

WakeupMode = Literal["after_commit", "in_transaction", "none"]
WAKEUP_MODES: tuple[str, ...] = get_args(WakeupMode)
#: Seconds between two in-transaction wakeups of one queue from one process ("in_transaction").
THROTTLE = 0.1
#: Queues whose last in-transaction wakeup a ``Jobs`` remembers before it forgets the quiet ones.
QUEUES_KEPT = 1024
_PENDING_KEY = "sqla_jobs.wakeups"

log = logging.getLogger("sqla_jobs.enqueue.insert")


@dataclass
class Wakeup:
    """How the enqueues of one ``Jobs`` wake workers listening on ``channel``."""

    channel: str
    mode: WakeupMode = "after_commit"
    _last: dict[str, float] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def plan(self, session: Session, queues: list[str]) -> list[str]:
        """Of ``queues`` (of jobs due now, not yet woken by this transaction): those whose NOTIFY
        goes into the enqueuing transaction. The others are kept to be sent after the commit, or
        dropped (mode ``"none"``, or throttled)."""
        if self.mode == "none":
            return []
        if self.mode == "in_transaction":
            now = time.monotonic()
            with self._lock:
                due = [q for q in queues if now - self._last.get(q, -THROTTLE) >= THROTTLE]
                if len(self._last) > QUEUES_KEPT:  # a queue per tenant: forget the quiet ones
                    self._last = {q: t for q, t in self._last.items() if now - t < THROTTLE}
                self._last.update(dict.fromkeys(due, now))
            return due
        bind = session.get_bind(mapper=Job)
        if not isinstance(bind, Engine):
            return queues
        tx = session.get_nested_transaction() or session.get_transaction()
        if tx is not None:
            pending: list[tuple[SessionTransaction, str, str, str]] = session.info.setdefault(
                _PENDING_KEY, []
            )
            target = _conninfo(bind)
            pending.extend((tx, target, self.channel, q) for q in queues)
        return []


def due_now(run_at: datetime | None, delay_us: int) -> bool:
    """Whether a job enqueued with ``run_at`` / ``delay_us`` is due at once (by this process's
    clock, for an explicit ``run_at``; a little skew costs at most one poll interval)."""
    if run_at is None:
        return delay_us <= 0
    return run_at <= datetime.now(timezone.utc)


#: Weak: an application (or a test suite) that makes and disposes of engines does not keep them.
_conninfos: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def _conninfo(engine: Engine) -> str:
    """The engine's URL as the notifier's libpq connection string."""
    found = _conninfos.get(engine)
    if found is None:
        url = engine.url.render_as_string(hide_password=False)
        found = _conninfos[engine] = libpq_conninfo(url)
    return found


def _on_commit(session: Session) -> None:
    # Every Session's commit runs this: the one without wakeups returns on a dict lookup.
    if not session.info.get(_PENDING_KEY):
        return
    # after_commit fires for a released savepoint too: only the root's commit is the real one.
    if session.get_nested_transaction() is not None:
        return
    pending: list[tuple[SessionTransaction, str, str, str]] = session.info.pop(_PENDING_KEY)
    by_target: dict[str, dict[tuple[str, str], None]]
    if len(pending) == 1:  # the common case: one enqueue in the transaction
        _tx, target, channel, queue = pending[0]
        by_target = {target: {(channel, queue): None}}
    else:
        by_target = {}
        for _tx, target, channel, queue in pending:
            by_target.setdefault(target, {})[(channel, queue)] = None
    for target, wakeups in by_target.items():
        hand_over(target, wakeups)


def hand_over(target: str, wakeups: Collection[tuple[str, str]]) -> None:
    """Give a committed transaction's wakeups to ``target``'s notifier; never raises."""
    try:
        _notifier.notifier(target).send(wakeups)
    except Exception as exc:
        # The transaction has committed: an exception here would report its jobs as lost.
        log.warning(
            "could not hand %d wakeup(s) to the notifier (workers find the jobs by polling): %s",
            len(wakeups),
            exc,
            extra={"event": "notifier_failed"},
        )


def _on_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    pending = session.info.get(_PENDING_KEY)
    if pending:
        pending[:] = [p for p in pending if not _within(p[0], previous_transaction)]


def _on_end(session: Session, transaction: SessionTransaction) -> None:
    # The root ended without its commit sending them (closed, or the commit failed): never sent.
    if transaction.parent is None:
        session.info.pop(_PENDING_KEY, None)


def _within(tx: SessionTransaction | None, outer: SessionTransaction) -> bool:
    while tx is not None:
        if tx is outer:
            return True
        tx = tx.parent
    return False


def check_mode(mode: Any) -> WakeupMode:
    """``mode`` if it is a wakeup mode; else ValueError naming the ones there are."""
    if mode not in WAKEUP_MODES:
        raise ValueError(
            f"wakeup must be one of {', '.join(repr(m) for m in WAKEUP_MODES)}, not {mode!r}"
        )
    return mode  # type: ignore[no-any-return]


event.listen(Session, "after_commit", _on_commit)
event.listen(Session, "after_soft_rollback", _on_rollback)
event.listen(Session, "after_transaction_end", _on_end)
