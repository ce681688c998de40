"""Before a worker starts its threads: a server that takes writes, then the checks that need one.

A worker whose URL leads only to a standby (or to a primary turned read-only for a switchover)
waits for a primary instead of exiting: it says why in one line, then at most once a minute, and
in one line naming the host once a server takes writes (the process's
:mod:`~sqla_jobs.db.outage` account, shared with the running threads). A URL that no server
answers at all (refused, unknown host, wrong password) at the worker's very first attempt raises at
once, as a misconfiguration should. A stop (SIGTERM, Ctrl-C, :meth:`Worker.stop`) ends the wait at
once, a connection attempt in flight included.

The checks that follow (the scheduler's grants, the handler Sessions' grants, the first claim
connection and the registry row) run once a server takes writes; one that meets a lost connection
(a failover under way) waits again and runs them all again. The same check losing its connection
twice in a row while a primary answers is no failover: it raises. The connection that found the
primary becomes the first claim lane's: a start opens one connection fewer before its first claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import psycopg

from sqla_jobs.db.connections import (
    AsyncConn,
    Connector,
    Reconnects,
    aclose_quietly,
    not_primary,
    should_reconnect,
)
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.session_checks import check_sessions
from sqla_jobs.worker.wakeups import Wakeups

if TYPE_CHECKING:
    from sqla_jobs.jobs import Jobs
    from sqla_jobs.periodic.scheduler import Scheduler
    from sqla_jobs.worker.monitor import Monitor
    from sqla_jobs.worker.parts import Parts
    from sqla_jobs.worker.session_runs import SessionRuns

T = TypeVar("T")
log = logging.getLogger("sqla_jobs.worker")

#: Seconds a start-up connection attempt may take per host (a frozen host does not answer).
CONNECT_TIMEOUT = 5


class NoPrimary(Exception):
    """No server of the URL takes writes; the message says what the first that answers is."""


class Startup:
    """The start of one worker on ``connector``'s URL; ``wakeups.stopping`` ends every wait."""

    def __init__(self, connector: Connector, wakeups: Wakeups) -> None:
        self._connector = connector
        self._wakeups = wakeups
        self._reconnects = Reconnects("worker start-up", "no_primary", starting=True)
        self._first = True

    async def run(
        self,
        checks: Callable[[AsyncConn], Awaitable[None]],
        undo: Callable[[], Awaitable[None]],
    ) -> bool:
        """Run ``checks`` once a server takes writes, given the connection that found it (theirs
        to keep or close, also when they raise); after a lost connection in them, ``undo`` what
        they opened, wait and run them again. False: stopped before they passed."""
        failed = False
        while True:
            found = await self._primary()
            if found is None:
                return False
            conn, waited = found
            failed = failed and not waited
            try:
                await checks(conn)
                return True
            except Exception as exc:
                if failed or not should_reconnect(exc):
                    raise
                failed = True
                await undo()
                self._reconnects.lost(exc)

    async def _primary(self) -> tuple[AsyncConn, bool] | None:
        """Until a server of the URL takes writes: a connection to it, and whether it had to
        wait (None: stopped)."""
        waited = False
        while not self._wakeups.stopping:
            try:
                # Named as the claim connection it becomes.
                conn = await self._unless_stopped(self._connect("claim"))
                if conn is None:
                    return None
                try:
                    why = not_primary(conn)
                except BaseException:
                    await aclose_quietly(conn)
                    raise
                if why is None:
                    self._reconnects.ok(conn)
                    self._first = False
                    return conn, waited
                await aclose_quietly(conn)
                lost: BaseException = NoPrimary(why)
            except Exception as exc:
                if not should_reconnect(exc):
                    raise
                lost = await self._explain(exc)
            self._first = False
            waited = True
            if not await self._pause(self._reconnects.lost(lost)):
                return None
        return None

    async def _connect(self, role: str, **extra: object) -> AsyncConn:
        return await self._connector.aconnect(role, connect_timeout=CONNECT_TIMEOUT, **extra)

    async def _explain(self, exc: Exception) -> BaseException:
        """Why no connection takes writes: a server that answers but is a standby (found by a
        connection to any server of the URL), else ``exc``, raised if this was the first attempt:
        nothing answers a URL that never worked."""
        try:
            conn = await self._unless_stopped(self._connect("start", target_session_attrs="any"))
        except Exception:
            if self._first:
                raise exc from None
            return exc
        if conn is None:
            return exc
        try:
            why = not_primary(conn)
        finally:
            await aclose_quietly(conn)
        return NoPrimary(why) if why is not None else exc

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` or until stopped; whether to go on."""
        wakeups = self._wakeups
        if wakeups.stopping:
            return False
        wakeups.event.clear()
        await wakeups.sleep(seconds)
        return not wakeups.stopping

    async def _unless_stopped(self, aw: Awaitable[T]) -> T | None:
        """``aw``'s result, or None (``aw`` cancelled) if the worker is stopped first."""
        task = asyncio.ensure_future(aw)
        wakeups = self._wakeups
        while not task.done():
            if wakeups.stopping:
                task.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    late = await task  # it may have finished as it was cancelled
                    if isinstance(late, psycopg.AsyncConnection):
                        await late.close()
                return None
            wakeups.event.clear()
            waiter = asyncio.ensure_future(wakeups.event.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        return task.result()


@dataclass
class StartChecks:
    """What must pass before a worker's threads start, on the event loop: the scheduler's grants,
    the handler Sessions' grants, the parts built (``build``, once) and the registry row written
    on the first claim connection."""

    jobs: Jobs
    queues: tuple[str, ...]
    scheduler: Scheduler | None
    sessions: SessionRuns | None
    monitor: Monitor
    build: Callable[[], Parts]
    parts: Parts | None = None

    async def run(self, conn: AsyncConn) -> None:
        """The checks, ``conn`` (on the primary) becoming the first claim lane's connection."""
        try:
            if self.scheduler is not None:
                # A role that may not enqueue stops the worker, named.
                await asyncio.to_thread(self.scheduler.check)
            if self.sessions is not None:
                queues = self.queues
                handled = [k for k in self.jobs if k.wants_session and k.options.queue in queues]
                await check_sessions(self.sessions, handled)
            if self.parts is None:
                self.parts = self.build()
        except BaseException:
            await aclose_quietly(conn)
            raise
        lanes = self.parts.lanes
        await self.monitor.join(await lanes.adopt(lanes.lanes[0], conn))

    async def undo(self) -> None:
        """Drop the connections the checks opened (they met a failover)."""
        if self.parts is not None:
            await self.parts.lanes.close()
        if self.scheduler is not None:
            self.scheduler.engine.dispose()

    async def close(self) -> None:
        """The worker stops before its threads started: close whatever was opened."""
        await self.monitor.close(None)
        await self.undo()
        if self.sessions is not None:
            await self.sessions.close()
        if self.parts is not None:
            self.parts.slots.close()
            self.parts.steps.close()


def log_started(name: str, config: WorkerConfig, schedules: int) -> None:
    """The line that says a worker has started, and with what."""
    log.info(
        "worker %s started: queues=%s concurrency=%s lease=%gs listen=%s schedules=%d",
        name,
        ",".join(config.queues),
        config.concurrency,
        config.lease,
        config.listen,
        schedules,
        extra={"event": "started"},
    )
