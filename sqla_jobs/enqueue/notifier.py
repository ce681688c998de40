"""The per-process notifier: sends enqueue wakeups after the enqueuing transaction committed.

A ``pg_notify`` inside the application's transaction makes its COMMIT take PostgreSQL's
cluster-wide notification-queue lock and hold it until the commit record is flushed, which
serializes every enqueuing commit. Here the NOTIFY goes out on a connection of its own, after the
commit, in a transaction with ``synchronous_commit`` off: the lock is held for microseconds and no
application commit waits on it. Wakeups that arrive while a send is in flight, or within
:data:`INTERVAL` of the last one, are coalesced into the next statement, so the notifier never
falls behind and a busy process adds at most 1 / INTERVAL small transactions a second.

A wakeup is a hint: workers poll as a floor, and every (re)connect of their listener looks once.
So a send that fails is logged (once per outage): one the server refuses is dropped, one a lost
connection interrupted is sent again on the next (connections at least
:data:`~sqla_jobs.enqueue.notifier_thread.RETRY` apart); a process that dies between its commit
and the send only delays the job to the next poll.

This module keeps the process's notifiers, one per server: started on first use, flushed at exit,
left alone in a forked child. The thread is :mod:`~sqla_jobs.enqueue.notifier_thread`.
"""

from __future__ import annotations

import atexit
import os
import threading
import time

from sqla_jobs.enqueue.notifier_thread import INTERVAL as INTERVAL
from sqla_jobs.enqueue.notifier_thread import Notifier as Notifier

_lock = threading.Lock()
_notifiers: dict[str, Notifier] = {}
#: What a forked child inherited: never used, never closed (closing would end the parent's
#: connection, whose socket the child shares), only kept from the garbage collector.
_inherited: list[Notifier] = []


def notifier(conninfo: str) -> Notifier:
    """This process's notifier for ``conninfo``, started on first use (and again if its thread
    has ended)."""
    found = _notifiers.get(conninfo)
    if found is not None and not found.ended:
        return found
    with _lock:
        found = _notifiers.get(conninfo)
        if found is None or found.ended or not found.is_alive():
            found = Notifier(conninfo)
            found.start()
            _notifiers[conninfo] = found
    return found


def flush_all(timeout: float = 2.0) -> bool:
    """Wait until every notifier of this process has sent what it was given (at most
    ``timeout`` seconds in all); whether they all did."""
    deadline = time.monotonic() + timeout
    return all(
        [each.flush(max(0.0, deadline - time.monotonic())) for each in list(_notifiers.values())]
    )


def _at_exit() -> None:
    # A script that enqueues and ends still wakes the workers.
    flush_all()
    for each in list(_notifiers.values()):
        each.stop()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _inherited.extend(_notifiers.values())
    _notifiers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
