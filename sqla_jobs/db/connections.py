"""How a worker opens its connections, and how every one of them comes back after a loss.

One recipe for every long-lived connection (claim lanes, listener, leases, reaper, step writer):
autocommit, TCP keepalives, the worker's application name, jsonb fetched as text (payloads are
decoded by pydantic, so a payload Python's json module cannot decode kills its job, not the
connection's loop). One reconnect policy: which errors mean "reconnect"
(:mod:`sqla_jobs.db.failover`: a lost connection, or a server that is not the primary any more),
a capped doubling delay with jitter, and one account of the outage for the whole process
(:mod:`sqla_jobs.db.outage`).
"""

from __future__ import annotations

import logging
import random
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from sqla_jobs.db.failover import is_lost
from sqla_jobs.db.outage import OUTAGE, Outage
from sqla_jobs.db.urls import KEEPALIVES

log = logging.getLogger("sqla_jobs.worker")

#: Errors that mean "the connection is gone, or its server is not the primary": reconnect, never
#: crash. A read-only transaction (25006) is the one such error outside psycopg's
#: OperationalError; :func:`should_reconnect` also knows the ones told apart by their message.
CONNECTION_ERRORS = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.ReadOnlySqlTransaction,
)


def should_reconnect(exc: BaseException) -> bool:
    """Whether a worker thread that met ``exc`` on its connection drops it and reconnects."""
    return isinstance(exc, CONNECTION_ERRORS) or is_lost(exc)


def where(conn: Conn | AsyncConn | None) -> str | None:
    """``host:port`` of ``conn``'s server (for the line that says the database is back)."""
    if conn is None or conn.closed:
        return None
    try:
        return f"{conn.info.host}:{conn.info.port}"
    except psycopg.Error:
        return None


def takes_writes(conn: Conn | AsyncConn) -> bool:
    """Whether ``conn``'s server says it takes writes (not in hot standby, not read-only by
    default), as PostgreSQL 14 and later report it at every change; unknown counts as yes."""
    if conn.closed:
        return True
    for name in ("in_hot_standby", "default_transaction_read_only"):
        if conn.info.parameter_status(name) == "on":
            return False
    return True


def quiet(conn: Conn | AsyncConn) -> bool:
    """Whether an idle connection's socket has nothing to read: its server has not ended it (a
    backend terminated, or a server that went down, leaves a message or EOF to read)."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


def not_primary(conn: Conn | AsyncConn) -> str | None:
    """Why ``conn``'s server takes no writes, as it reports itself (None: it takes them, or does
    not say, as before PostgreSQL 14)."""
    if conn.info.parameter_status("in_hot_standby") == "on":
        return f"{where(conn)} answers, but is a standby (in recovery)"
    if conn.info.parameter_status("default_transaction_read_only") == "on":
        return f"{where(conn)} answers, but is read-only (default_transaction_read_only = on)"
    return None


Conn = psycopg.Connection[tuple[object, ...]]
AsyncConn = psycopg.AsyncConnection[tuple[object, ...]]


#: The longest wait between two reconnect attempts of a worker thread.
RECONNECT_CAP = 5.0
#: How long a worker thread's connection attempt may take (libpq's ``connect_timeout``).
THREAD_CONNECT_TIMEOUT = 5


def reconnect_delay(failures: int, first: float = 0.1, cap: float = RECONNECT_CAP) -> float:
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
    """The reconnect policy of one connection: :meth:`lost` tells the process's :class:`Outage`
    and returns how long to wait; :meth:`ok` after a success starts the backoff over (and ends the
    outage, once the connection is on a server that takes writes)."""

    def __init__(
        self,
        what: str,
        event: str,
        *,
        first: float = 0.1,
        cap: float = RECONNECT_CAP,
        outage: Outage | None = None,
        starting: bool = False,
    ) -> None:
        self._what = what
        self._starting = starting
        self._event = event
        self._first = first
        self._cap = cap
        self._outage = outage or OUTAGE
        #: The outage account's ``starts`` when this connection last worked (on a server that takes
        #: writes): a failure with an outage begun since, and ended, is that outage's echo.
        self._seen = self._outage.starts
        self.failures = 0

    def mark(self) -> int:
        """The outage account as a step begins, for its :meth:`ok` (``since``): the step's
        success proves the connection worked as of then. An outage another thread began meanwhile
        (the server went down just after the step's statement) is not one it lived through."""
        return self._outage.starts

    def lost(self, exc: BaseException) -> float:
        """Count a failure; tell the outage account; the seconds to wait before the next try
        (doubling, capped, with jitter so that a fleet does not reconnect in step)."""
        self.failures += 1
        delay = reconnect_delay(self.failures, self._first, self._cap) * random.uniform(0.5, 1.0)
        self._seen = self._outage.lost(
            self._what,
            exc,
            seen=self._seen,
            event=self._event,
            delay=delay,
            starting=self._starting,
        )
        return delay

    def ok(
        self, conn: Conn | AsyncConn | None = None, *, used: bool = True, since: int | None = None
    ) -> None:
        """The connection works again; ``conn``, when given and on a server that takes writes,
        ends the process's outage (a step that says nothing of its connection does not). A step
        that ``used`` such a ``conn``, or an idle one whose socket is :func:`quiet` after the
        outage, also marks it as working since the latest outage that began before ``since``
        (:meth:`mark` as the step began; default: now): its next failure is news, not that
        outage's echo."""
        outage = self._outage
        began = outage.starts if since is None else since
        if not self.failures:
            if (
                self._seen < began
                and conn is not None
                and not conn.closed
                and takes_writes(conn)
                # An idle connection whose socket is quiet once the outage is over lived
                # through it: its next failure is news too (a claim lane used now and then).
                and (used or (not outage.active and quiet(conn)))
            ):
                self._seen = began
            return
        if conn is None or conn.closed:
            self.failures = 0
            return
        if not takes_writes(conn):
            return  # a read worked on a standby: the outage goes on for who needs writes
        self.failures = 0
        outage.back(self._what, where(conn))
        self._seen = outage.starts


def serve(
    stop: threading.Event,
    step: Callable[[], float],
    reconnects: Reconnects,
    *,
    close: Callable[[], None],
    wait: Callable[[float], None] | None = None,
    errors: tuple[type[BaseException], ...] = CONNECTION_ERRORS,
    current: Callable[[], Conn | None] | None = None,
) -> None:
    """The loop of a worker thread that owns a connection: run ``step`` (which returns the seconds
    until the next one) until ``stop`` is set; on a lost connection (``errors``, or any error
    :func:`should_reconnect` knows), ``close`` it and wait as ``reconnects`` says. ``wait``
    defaults to ``stop.wait``; ``current`` returns the connection, to say where it is back."""
    pause = wait or stop.wait
    while not stop.is_set():
        try:
            since = reconnects.mark()
            seconds = step()
            reconnects.ok(current() if current is not None else None, since=since)
        except Exception as exc:
            if not (isinstance(exc, errors) or should_reconnect(exc)):
                raise
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
        self,
        connector: Connector,
        role: str,
        *,
        what: str,
        event: str,
        connect_timeout: int = THREAD_CONNECT_TIMEOUT,
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
        serve(
            self._stop_event,
            self.step,
            self._reconnects,
            close=self._close,
            current=lambda: self._conn,
        )

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
