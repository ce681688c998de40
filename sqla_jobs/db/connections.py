"""How a worker opens its connections, and how every one of them comes back after a loss.

One recipe for every long-lived connection (claim lanes, listener, leases, reaper, step writer):
autocommit, TCP keepalives, the worker's application name, jsonb fetched as text (payloads are
decoded by pydantic, so a payload Python's json module cannot decode kills its job, not the
connection's loop). One reconnect policy: which errors mean "reconnect", a capped doubling delay,
one log line per loss.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from sqla_jobs.db.urls import KEEPALIVES

log = logging.getLogger("sqla_jobs.worker")

#: Errors that mean "the connection is gone": reconnect, never crash.
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

Conn = psycopg.Connection[tuple[object, ...]]
AsyncConn = psycopg.AsyncConnection[tuple[object, ...]]


def reconnect_delay(failures: int, first: float = 0.1, cap: float = 5.0) -> float:
    """Seconds to wait after the ``failures``-th consecutive failure: doubling from ``2 * first``,
    capped, so a database that is down costs a bounded number of attempts, not a busy loop."""
    return min(first * float(2 ** min(failures, 32)), cap)


@dataclass
class Connector:
    """Opens the worker's connections to ``conninfo``, every one the same way.

    ``role`` names the connection in ``pg_stat_activity`` (``sqla-jobs <role> <worker>``).
    ``prepare_threshold`` None stops psycopg from preparing statements server-side (PgBouncer
    before 1.21). Tests may subclass it to see or break the connections a worker opens.
    """

    conninfo: str
    worker: str
    prepare_threshold: int | None = 5

    def app_name(self, role: str) -> str:
        """The connection's ``application_name`` (at most 63 bytes)."""
        return f"sqla-jobs {role} {self.worker}"[:63]

    def _options(self, role: str, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            **KEEPALIVES,
            "autocommit": True,
            "connect_timeout": 10,
            "application_name": self.app_name(role),
            "prepare_threshold": self.prepare_threshold,
            **extra,
        }

    def connect(self, role: str, **extra: Any) -> Conn:
        """A blocking connection (threads: listener, leases, reaper, steps)."""
        conn = psycopg.connect(self.conninfo, **self._options(role, extra))
        conn.adapters.register_loader("jsonb", TextLoader)
        return conn

    async def aconnect(self, role: str, **extra: Any) -> AsyncConn:
        """An asyncio connection (the claim lanes)."""
        conn = await psycopg.AsyncConnection.connect(self.conninfo, **self._options(role, extra))
        conn.adapters.register_loader("jsonb", TextLoader)
        return conn


class Reconnects:
    """The reconnect policy of one connection: :meth:`lost` logs the loss and returns how long to
    wait; :meth:`ok` after a success starts the backoff over."""

    def __init__(self, what: str, event: str, *, first: float = 0.1, cap: float = 5.0) -> None:
        self._what = what
        self._event = event
        self._first = first
        self._cap = cap
        self.failures = 0

    def lost(self, exc: BaseException) -> float:
        """Count a failure; log it; the seconds to wait before the next try."""
        self.failures += 1
        delay = reconnect_delay(self.failures, self._first, self._cap)
        log.warning(
            "%s lost, reconnecting in %.2fs: %s",
            self._what,
            delay,
            exc,
            extra={"event": self._event},
        )
        return delay

    def ok(self) -> None:
        """The connection works again."""
        self.failures = 0


def serve(
    stop: threading.Event,
    step: Callable[[], float],
    reconnects: Reconnects,
    *,
    close: Callable[[], None],
    wait: Callable[[float], None] | None = None,
    errors: tuple[type[BaseException], ...] = CONNECTION_ERRORS,
) -> None:
    """The loop of a worker thread that owns a connection: run ``step`` (which returns the seconds
    until the next one) until ``stop`` is set; on a lost connection, ``close`` it and wait as
    ``reconnects`` says. ``wait`` defaults to ``stop.wait``."""
    pause = wait or stop.wait
    while not stop.is_set():
        try:
            seconds = step()
            reconnects.ok()
        except errors as exc:
            close()
            if stop.is_set():
                break
            seconds = reconnects.lost(exc)
        pause(seconds)
    close()


class ConnectionThread(threading.Thread):
    """A worker thread that owns one connection (opened as ``role``, at most ``connect_timeout``
    seconds) and runs :meth:`step` until :meth:`stop`, coming back after a lost connection as
    :func:`serve` does; the step returns the seconds until the next one."""

    def __init__(
        self, connector: Connector, role: str, *, what: str, event: str, connect_timeout: int = 5
    ) -> None:
        super().__init__(name=f"sqla-jobs-{role}-{connector.worker}", daemon=True)
        self._connector = connector
        self._role = role
        self._connect_timeout = connect_timeout
        self._reconnects = Reconnects(what, event)
        self._stop_event = threading.Event()
        self._conn: Conn | None = None

    def stop(self) -> None:
        """Ask the thread to finish its current step and exit."""
        self._stop_event.set()

    def run(self) -> None:
        serve(self._stop_event, self.step, self._reconnects, close=self._close)

    def step(self) -> float:
        """One round of the thread's work; the seconds until the next."""
        raise NotImplementedError

    def connection(self) -> Conn:
        """The thread's connection, opened if it has none."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connector.connect(self._role, connect_timeout=self._connect_timeout)
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)


def close_quietly(conn: Conn | None) -> None:
    """Close ``conn`` if there is one; a broken connection has nothing left to report."""
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


async def aclose_quietly(conn: AsyncConn | None) -> None:
    """:func:`close_quietly` for an async connection."""
    if conn is not None:
        try:
            await conn.close()
        except Exception:
            pass
