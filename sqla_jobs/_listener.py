"""The dedicated LISTEN connection: wakes the worker's fetch loop when a job is enqueued.

LISTEN is session state, so it never lives on a pooled connection. NOTIFY is fire-and-forget: a
notification sent while the listener is disconnected is gone, which is why polling stays the floor
and why every (re)connect wakes the loop once. A half-open connection (the server vanished without
a FIN) is detected by a liveness query with a deadline after each quiet period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

import psycopg
from psycopg import sql

from ._connections import aclose_quietly, reconnect_delay
from ._db import KEEPALIVES

log = logging.getLogger("sqla_jobs.worker")


class Listener:
    """Listen on ``channel``; call ``wake()`` for notifications naming one of ``queues`` and after
    every (re)connect. Reconnects with capped exponential backoff."""

    def __init__(
        self,
        conninfo: str,
        channel: str,
        queues: Collection[str],
        wake: Callable[[], None],
        *,
        application_name: str = "sqla-jobs listen",
        check_interval: float = 5.0,
        check_timeout: float = 5.0,
        max_backoff: float = 5.0,
    ) -> None:
        self._conninfo = conninfo
        self._application_name = application_name
        self._channel = channel
        self._queues = frozenset(queues)
        self._wake = wake
        self._check_interval = check_interval
        self._check_timeout = check_timeout
        self._max_backoff = max_backoff
        self.connected = asyncio.Event()
        #: How many times the connection was (re)established; tests watch it.
        self.connects = 0
        #: Failed attempts since the last successful connect: the backoff exponent.
        self._failures = 0
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def run(self) -> None:
        """Listen until cancelled."""
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                await self._close()
                raise
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self.connected.clear()
                await self._close()
                self._failures += 1
                delay = reconnect_delay(self._failures, first=0.05, cap=self._max_backoff)
                log.warning(
                    "LISTEN connection lost, reconnecting in %.2fs (polling meanwhile): %s",
                    delay,
                    exc,
                    extra={"event": "listener_lost"},
                )
                await asyncio.sleep(delay)

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo,
            **KEEPALIVES,
            autocommit=True,
            connect_timeout=5,
            application_name=self._application_name,
        )
        self._conn = conn
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        self.connects += 1
        # Connected again: the next loss starts the backoff over, however many came before.
        self._failures = 0
        self.connected.set()
        # Anything enqueued while we were away was announced to nobody: look once.
        self._wake()
        if self.connects > 1:
            log.info("LISTEN connection re-established", extra={"event": "listener_back"})
        while True:
            async for note in conn.notifies(timeout=self._check_interval):
                if note.payload in self._queues:
                    self._wake()
            # A quiet period: prove the connection is alive, with a deadline.
            await asyncio.wait_for(conn.execute("SELECT 1"), self._check_timeout)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        await aclose_quietly(conn)
