"""The fetch loop's wake event and the flags every part of a worker reads.

It is the one interface between the worker's threads and its event loop: the listener's and the
handlers' threads reach the loop only through :meth:`Wakeups.call_soon` and
:meth:`Wakeups.wake_from_thread`, never through another part's private state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class Wakeups:
    """Whether and when the fetch loop should look for work, for the event loop ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: Set to wake the fetch loop; the loop clears it on each turn.
        self.event = asyncio.Event()
        self.stopping = False
        #: The last claim found fewer jobs than asked: the queue is empty until a NOTIFY, a job
        #: of a key ending, or the poll timer says otherwise.
        self.drained = False
        #: Bumped by every wakeup, so a claim can tell whether one arrived while it was in flight.
        self.count = 0
        #: Round trips (outcomes and/or a claim) in flight, one per busy lane.
        self.in_flight = 0
        #: time.monotonic() of the last claim.
        self.last_claim = 0.0
        #: A wakeup from another thread is on its way to the loop (it coalesces the next ones).
        self.pending = False
        #: time.monotonic() of the next start this worker could make that nothing will announce
        #: (a delayed job coming due): a drained worker sleeps until then at most, then polls.
        #: Any part lowers it (:meth:`start_by`); the fetch loop consumes it when it passes.
        self.next_start: float | None = None

    def start_by(self, when: float) -> None:
        """Something may become claimable at ``when`` (time.monotonic()): make sure the fetch loop
        looks then. On the loop only."""
        if self.next_start is None or when < self.next_start:
            self.next_start = when
            # The loop re-arms its sleep with the earlier time.
            self.event.set()

    def start_by_from_thread(self, seconds: float) -> None:
        """:meth:`start_by` ``seconds`` from now, from another thread."""
        self.call_soon(self.start_by, time.monotonic() + seconds)

    def undrain(self) -> None:
        """Something may be claimable now: the next turn claims."""
        self.count += 1
        self.drained = False

    def wake(self) -> None:
        """Make the fetch loop look for work now (what a NOTIFY does). On the loop only."""
        self.undrain()
        self.event.set()

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop; from any thread. A closed loop (the worker is
        gone) drops it: leases then expire and are reaped."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass

    def wake_from_thread(self) -> None:
        """:meth:`wake`, from another thread. One wakeup on its way at a time: a notification
        that finds one pending is covered by it (the loop counts it when it runs, after)."""
        if not self.pending:
            self.pending = True
            self.call_soon(self._woken)

    def _woken(self) -> None:
        self.pending = False
        self.wake()

    async def sleep(self, seconds: float) -> None:
        """Until woken or ``seconds`` pass: the timer sets the event itself (cheaper than
        ``wait_for``, which wraps the wait in a task)."""
        event = self.event
        if event.is_set():
            return
        timer = self.loop.call_later(seconds, event.set)
        try:
            await event.wait()
        finally:
            timer.cancel()
