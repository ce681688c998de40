"""The worker's log records, printed as events of the story.

The handler reads what the worker puts on each record for handlers like it: ``event`` (what
happened), ``run_at`` (when a failed job is due again) and the formatted message. It never looks
at the message's arguments, whose order is the worker's business, not the demo's.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime

from .console import Console, no_location

#: The logger whose records the story shows.
WORKER_LOGGER = "sqla_jobs.worker"
#: Events the demo tells in its own words (or not at all).
_UNTOLD = {"started", "stopped", "stopping", "completed", "completed_more"}
#: Where the arrow lines of an event start: under its text, past the ``[t+ 0.00s]`` stamp.
_ARROW = " " * 13
#: The threads of a worker's services: ``sqla-jobs-<role>-<worker name>``.
_SERVICE_THREAD = re.compile(r"sqla-jobs-([a-z]+)-(.+)")


class WorkerEvents(logging.Handler):
    """Prints the worker's records (failures, dead jobs, reaped leases) as events.

    ``clock_offset`` is the database clock minus this machine's, so that a ``run_at`` the database
    computed can be shown as a delay from the moment of the failure.
    """

    def __init__(self, console: Console, clock_offset: float) -> None:
        super().__init__(logging.DEBUG)
        self.console = console
        self.clock_offset = clock_offset

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.describe(record)
        except Exception:
            self.handleError(record)
            return
        if text:
            self.console.event(text, at=record.created)

    def describe(self, record: logging.LogRecord) -> str | None:
        """The event's line(s), or None for a record the story leaves out."""
        event = getattr(record, "event", None)
        if event in _UNTOLD:
            return None
        # The worker's event loop runs in the thread named after the worker (the demo names it);
        # its services, such as the reaper, in threads named after their role and the worker.
        who = record.threadName or "?"
        service = _SERVICE_THREAD.fullmatch(who)
        if service is not None:
            who = f"{service[2]} ({service[1]})"
        text = f"{who}: {no_location(record.getMessage())}"
        if event == "failed":
            run_at = getattr(record, "run_at", None)
            if isinstance(run_at, datetime):
                delay = run_at.timestamp() - (record.created + self.clock_offset)
                text += (
                    f"\n{_ARROW}-> back to pending, due again in {delay:.2f}s "
                    "(run_at set by the database)"
                )
        elif event == "dead":
            text += (
                f"\n{_ARROW}-> DEAD: its failure budget is spent; it stays in the table for a human"
            )
        return text


class AttachedEvents:
    """:class:`WorkerEvents` on the worker's logger while attached; the logger as it was after."""

    def __init__(self, console: Console, clock_offset: float) -> None:
        self.handler = WorkerEvents(console, clock_offset)
        self._logger = logging.getLogger(WORKER_LOGGER)
        self._saved: tuple[int, bool] | None = None

    def attach(self) -> None:
        """Send the worker's records, every level, to the story alone."""
        self._saved = (self._logger.level, self._logger.propagate)
        self._logger.addHandler(self.handler)
        self._logger.setLevel(logging.DEBUG)
        self._logger.propagate = False

    def detach(self) -> None:
        """Restore the logger (safe to call twice)."""
        self._logger.removeHandler(self.handler)
        if self._saved is not None:
            self._logger.setLevel(self._saved[0])
            self._logger.propagate = self._saved[1]
            self._saved = None
