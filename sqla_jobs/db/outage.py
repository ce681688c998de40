"""One process-wide account of a database outage, so a failover costs a few log lines, not one
per retry and thread.

Every thread of a worker (and the notifier of an application) meets a failover on its own
connection, at its own time, and retries with backoff until a server takes its writes again. Left
to themselves they would each log every retry: thousands of lines for a few seconds of hot standby.
The :class:`Outage` hears all of them and says: one line when the outage starts (naming the
error), a reminder at most once a minute while it lasts (a worker whose URL names only standbys
says why it waits), and one line when it ends (naming the host that takes the writes now).

A connection that has not worked since before an outage began and fails after it ended (a thread
asleep through the failover, waking on the demoted server) is the same outage's echo: it
reconnects quietly, once. A connection that worked since the outage began (a claim lane busy while
the listener was away) and fails after its end meets a new outage: that one is said.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("sqla_jobs.worker")

#: At most one "still no primary" line this often, while an outage lasts (seconds).
REMIND_EVERY = 60.0


def describe(exc: BaseException) -> str:
    """``Class: first line`` of ``exc``, with a hint where the error says "not a primary"."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    said = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    lowered = text.lower()
    if "read-only" in lowered or "hot standby" in lowered or "recovery" in lowered:
        said += " (the server is not the primary: a standby, or a primary being demoted)"
    return said


class Outage:
    """The process's outage account (see the module's docstring). ``clock`` is injectable so
    tests need not wait a minute."""

    def __init__(
        self,
        *,
        remind_every: float = REMIND_EVERY,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self._remind_every = remind_every
        self._clock = clock
        self._log = logger
        self._lock = threading.Lock()
        self.active = False
        #: Outages started so far: a connection whose last success saw fewer fails as an echo.
        self.starts = 0
        self._started = 0.0
        self._said = 0.0
        self._failures = 0

    def lost(
        self,
        who: str,
        exc: BaseException,
        *,
        seen: int,
        event: str,
        delay: float,
        starting: bool = False,
    ) -> int:
        """``who`` lost its connection to ``exc`` and tries again in ``delay`` seconds; ``seen``
        is :attr:`starts` as it was when that connection last worked. Logs the start of an
        outage, or a reminder, or only at DEBUG (every retry, with its delay). Returns
        the ``seen`` to pass next time: after an echo, the current :attr:`starts` (one echo per
        connection), else ``seen`` unchanged (only a success moves it on). ``starting``: a worker
        that never had a connection yet (it waits for a primary)."""
        with self._lock:
            now = self._clock()
            if self.active:
                self._failures += 1
                if now - self._said < self._remind_every:
                    self._log.debug(
                        "%s lost, reconnecting in %.2fs: %s",
                        who,
                        delay,
                        describe(exc),
                        extra={"event": event},
                    )
                    return seen
                self._said = now
                self._log.warning(
                    "still no database that takes writes, after %.0fs and %d failed attempts: %s",
                    now - self._started,
                    self._failures,
                    describe(exc),
                    extra={"event": "db_outage_continues"},
                )
                return seen
            if seen < self.starts:
                self._log.debug(
                    "%s lost (after the outage), reconnecting in %.2fs: %s",
                    who,
                    delay,
                    describe(exc),
                    extra={"event": event},
                )
                return self.starts
            self.active = True
            self.starts += 1
            self._started = self._said = now
            self._failures = 1
            if starting:
                self._log.warning(
                    "no database that takes writes yet (%s, %s): the worker waits for a primary "
                    "before it starts, trying again with backoff; one line will say when one "
                    "takes writes",
                    who,
                    describe(exc),
                    extra={"event": event},
                )
                return seen
            self._log.warning(
                "database connection lost (%s, %s): reconnecting in %.2fs, every connection "
                "with backoff; one line will say when the database is back",
                who,
                describe(exc),
                delay,
                extra={"event": event},
            )
            return seen

    def back(self, who: str, where: str | None) -> None:
        """``who`` works again, on ``where`` (``host:port``): ends the outage, if one is on."""
        with self._lock:
            if not self.active:
                return
            self.active = False
            self._log.warning(
                "database back after %.1fs (%d failed attempts): %s works again on %s",
                self._clock() - self._started,
                self._failures,
                who,
                where or "the database",
                extra={"event": "db_back"},
            )


#: The process's account, shared by every thread and connection.
OUTAGE = Outage()
