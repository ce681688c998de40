"""The wakeup of a delayed job: after the commit, idle workers are told when it becomes due.

A job enqueued with ``delay=`` or a future ``run_at`` is not claimable yet, so a plain wakeup would
send workers to a claim that finds nothing. Instead, in the ``"after_commit"`` mode, a job due
within :data:`~sqla_jobs.enqueue.payloads.HORIZON` seconds makes the notifier send
``due QUEUE SECONDS`` after the commit (the earliest of the transaction's, per queue): a worker
sets its timer for then and claims when the job is due. A job due later is found by the worker's
poll probe, which tells it the next due time on the database's clock.

The seconds are counted on this process's monotonic clock from the enqueue (``delay=``: the job's
``run_at`` is the transaction's ``now()`` plus the delay, at or before that), or from its clock's
reading of ``run_at``; a worker that wakes a little early (a skewed clock) probes, finds the job not
due yet, and sleeps until the database says it is. Nothing here runs for a job due now: the
listeners are installed on the first delayed enqueue.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, SessionTransaction

from sqla_jobs.enqueue.payloads import HORIZON, format_due
from sqla_jobs.enqueue.wakeup import Wakeup, _conninfo, _within, hand_over
from sqla_jobs.model import Job

_PENDING_KEY = "sqla_jobs.due"

#: (transaction, notifier's conninfo, channel, queue, time.monotonic() when due)
_Pending = tuple[SessionTransaction, str, str, str, float]


def announce(
    session: Session, wakeup: Wakeup, queues: list[str], run_at: datetime | None, delay_us: int
) -> None:
    """Keep a ``due`` wakeup of ``queues``, for jobs just enqueued with ``run_at`` / ``delay_us``
    in ``session``'s transaction, to be sent after its commit; nothing for a job already due,
    one due past the horizon, or a mode other than ``"after_commit"`` (see the module's doc)."""
    if wakeup.mode != "after_commit":
        return
    if run_at is None:
        seconds = delay_us / 1e6
    else:
        seconds = (run_at - datetime.now(timezone.utc)).total_seconds()
    if not 0 < seconds <= HORIZON:
        return
    bind = session.get_bind(mapper=Job)
    tx = session.get_nested_transaction() or session.get_transaction()
    if not isinstance(bind, Engine) or tx is None:
        # A Session bound to a Connection cannot know when the real commit happens.
        return
    if not _installed:
        _install()
    when = time.monotonic() + seconds
    pending: list[_Pending] = session.info.setdefault(_PENDING_KEY, [])
    target = _conninfo(bind)
    pending.extend((tx, target, wakeup.channel, q, when) for q in queues)


def _on_commit(session: Session) -> None:
    # Once installed, every Session's commit runs this: one without a delayed job returns on a
    # dict lookup.
    if not session.info.get(_PENDING_KEY):
        return
    # after_commit fires for a released savepoint too: only the root's commit is the real one.
    if session.get_nested_transaction() is not None:
        return
    pending: list[_Pending] = session.info.pop(_PENDING_KEY)
    earliest: dict[str, dict[tuple[str, str], float]] = {}
    for _tx, target, channel, queue, when in pending:
        first = earliest.setdefault(target, {})
        if when < first.get((channel, queue), when + 1.0):
            first[(channel, queue)] = when
    now = time.monotonic()
    for target, whens in earliest.items():
        # Due already (a long transaction): "due QUEUE 0" still, so the worker probes before it
        # claims, on the database's clock.
        hand_over(target, [(c, format_due(q, max(0.0, w - now))) for (c, q), w in whens.items()])


def _on_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    pending: list[_Pending] | None = session.info.get(_PENDING_KEY)
    if pending:
        pending[:] = [p for p in pending if not _within(p[0], previous_transaction)]


def _on_end(session: Session, transaction: SessionTransaction) -> None:
    # The root ended without its commit sending them (closed, or the commit failed): never sent.
    if transaction.parent is None:
        session.info.pop(_PENDING_KEY, None)


_installed = False
_install_lock = threading.Lock()


def _install() -> None:
    """Listen to every Session's transactions, from the first delayed enqueue on: an application
    that never delays a job pays nothing at its commits."""
    global _installed
    with _install_lock:
        if _installed:
            return
        event.listen(Session, "after_commit", _on_commit)
        event.listen(Session, "after_soft_rollback", _on_rollback)
        event.listen(Session, "after_transaction_end", _on_end)
        _installed = True
