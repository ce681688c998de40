"""How SIGTERM and SIGINT stop a worker that :meth:`~sqla_jobs.worker.facade.Worker.run_sync`
runs: the first stops it gracefully (running handlers get the shutdown timeout), a second one exits
the process at once with :data:`EXIT_FORCED` (the leases of its jobs then expire and are reaped).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("sqla_jobs.worker")

#: Exit code of a worker forced out by a second signal.
EXIT_FORCED = 130
#: The signals that stop a worker.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """The handlers of :data:`STOP_SIGNALS` on ``loop``: ``stop(sig)`` for the first signal, an
    exit for one that comes while ``stopping()`` already (the worker was asked to stop)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        stopping: Callable[[], bool],
        stop: Callable[[signal.Signals], None],
    ) -> None:
        self._loop = loop
        self._stopping = stopping
        self._stop = stop

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            self._loop.add_signal_handler(sig, self._on_signal, sig)

    def remove(self) -> None:
        for sig in STOP_SIGNALS:
            self._loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping():
            log.error("second %s: exiting now", sig.name, extra={"event": "forced"})
            logging.shutdown()
            os._exit(EXIT_FORCED)
        self._stop(sig)
