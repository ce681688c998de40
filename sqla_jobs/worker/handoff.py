"""The listener hand-off: an idle worker lets its listener's thread claim the moment a NOTIFY
arrives, on the LISTEN connection.

Before the fetch loop sleeps with nothing held and the queue looking empty, it *parks*: it hands
the right to make the next claim to the listener's thread. That saves two hops through the event
loop, the difference between an idle worker's pickup in about the raw LISTEN/NOTIFY baseline's time
and in twice it. The thread delivers what it claimed back to the loop through
:meth:`Wakeups.call_soon`; the gate lock is the only state the two threads share.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.listener import Connection as ListenConnection
from sqla_jobs.worker.prefetch import Prefetch
from sqla_jobs.worker.wakeups import Wakeups


def _awake() -> None:
    """Nothing: run on the event loop only to wake its thread (:meth:`Handoff.on_notify`)."""


class Handoff:
    """The claim an idle worker hands to its listener's thread."""

    def __init__(
        self,
        *,
        sql: WorkerSQL,
        worker: str,
        lease: timedelta,
        holdings: Holdings,
        prefetch: Prefetch,
        wakeups: Wakeups,
        counts: dict[str, int],
        keyed: bool,
        fill: Callable[[], None],
    ) -> None:
        self._sql = sql
        self._worker = worker
        self._lease = lease
        self._holdings = holdings
        self._prefetch = prefetch
        self._wakeups = wakeups
        self._counts = counts
        self._keyed = keyed
        self._fill = fill
        self._gate = threading.Lock()
        #: While the fetch loop sleeps with nothing held: the claim limit and the wakeup count.
        self.parked: tuple[int, int] | None = None
        #: A claim by the listener's thread is in flight: the fetch loop does not claim meanwhile.
        self.thread_claim = False

    def park(self, room: int) -> None:
        """Before the fetch loop sleeps: hand the next claim over, if the worker holds nothing
        and the queue looked empty."""
        holdings, wakeups = self._holdings, self._wakeups
        if (
            wakeups.stopping
            or not wakeups.drained
            or self.thread_claim
            or wakeups.in_flight
            or holdings.busy()
            or holdings.finished
            or holdings.give_back
        ):
            return
        limit = min(room, self._prefetch.limit)
        if limit > 0:
            with self._gate:
                self.parked = (limit, wakeups.count)

    def unpark(self) -> None:
        """Take the claim back (the fetch loop woke up); safe from any thread."""
        if self.parked is not None:
            with self._gate:
                self.parked = None

    def on_notify(self, conn: ListenConnection, queues: list[str]) -> None:
        """In the listener's thread, for each batch of notifications (``queues`` empty after a
        (re)connect): claim on its connection if the fetch loop is parked, else wake the loop."""
        parked = None
        if queues:
            with self._gate:
                if self.parked is not None and not self._wakeups.stopping:
                    parked, self.parked = self.parked, None
                    self.thread_claim = True
        if parked is None:
            self._wakeups.wake_from_thread()
            return
        limit, count = parked
        rows: list[Any] | None = None
        # The event loop's thread is woken as the claim starts, so the delivery finds it awake: a
        # thread's first steps after an idle spell cost several times their warm cost, and this
        # hop is on the pickup's path (bench/README.md).
        self._wakeups.call_soon(_awake)
        try:
            # The worker holds nothing, so no crashed job either: any may come (the crash rule
            # gives back what it must when the rows are taken).
            rows = conn.execute(
                self._sql.claim.sql,
                self._sql.claim.params(
                    queue=queues[0],
                    limit=limit,
                    lease=self._lease,
                    worker=self._worker,
                    monotonic_us=time.monotonic_ns() // 1000,
                ),
            ).fetchall()
        finally:
            # Even when it failed (the listener then reconnects): the loop must claim again.
            self._wakeups.call_soon(self._deliver, rows, limit, count, len(queues) > 1)

    def _deliver(self, rows: list[Any] | None, limit: int, count: int, more: bool) -> None:
        """On the event loop: take what the listener's thread claimed, and start it at once."""
        self.thread_claim = False
        wakeups = self._wakeups
        if rows is None:
            wakeups.wake()
            return
        now = wakeups.last_claim = time.monotonic()
        self._counts["claimed"] += self._holdings.take(rows, now)
        # As after the fetch loop's own claim: fewer than asked means the queue is empty for now,
        # unless a wakeup came since the park, other queues were notified too, or the loop has its
        # own claims to make (keyed jobs, jobs to give back).
        wakeups.drained = (
            len(rows) < limit
            and wakeups.count == count
            and not (more or self._keyed or self._holdings.give_back)
        )
        self._fill()
        wakeups.event.set()
