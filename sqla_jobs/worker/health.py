"""Whether a worker is healthy, as ``/healthz`` tells a supervisor: running its loop, not stopping,
no handler stuck.

The event loop moves a timestamp forward once a second (a timer callback, nothing per job); any
thread may then ask :meth:`Health.check`. A loop that has not turned for :data:`STALL_SECONDS` is
blocked (an async handler doing blocking work, a runaway middleware): the worker claims nothing
and renews leases only from its thread, so a supervisor should restart it.
"""

from __future__ import annotations

import asyncio
import time

from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.wakeups import Wakeups

#: A loop that has not turned for this many seconds is reported blocked.
STALL_SECONDS = 10.0
#: How often the loop moves its timestamp forward.
_TICK = 1.0


class Health:
    """The health of the worker whose loop ``wakeups`` belongs to."""

    def __init__(self, wakeups: Wakeups, holdings: Holdings) -> None:
        self._wakeups = wakeups
        self._holdings = holdings
        self._turned = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self.running = False

    def start(self) -> None:
        """The worker runs its loop: healthy from now on, while the loop turns. On the loop."""
        self.running = True
        self._tick()

    def stop(self) -> None:
        """The worker has stopped. On the loop."""
        self.running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._turned = time.monotonic()
        self._timer = self._wakeups.loop.call_later(_TICK, self._tick)

    def check(self) -> tuple[bool, str]:
        """(healthy, why): from any thread."""
        if self._holdings.stuck:
            return (
                False,
                f"stuck: {len(self._holdings.stuck)} sync handler(s) past timeout and grace",
            )
        if not self.running:
            return False, "not running"
        if self._wakeups.stopping:
            return False, "stopping"
        blocked = time.monotonic() - self._turned
        if blocked > STALL_SECONDS:
            return False, f"event loop blocked for {blocked:.0f}s"
        return True, "ok"
