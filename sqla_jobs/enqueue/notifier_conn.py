"""The notifier thread's I/O: its connection, the statement it sends, and the pipe that wakes it.

Kept apart from the thread's bookkeeping (:mod:`~sqla_jobs.enqueue.notifier_thread`): nothing here
takes its lock or keeps its state, so each function can be read without the other.
"""

from __future__ import annotations

import contextlib
import os
import select

import psycopg
from psycopg import sql

from sqla_jobs.db.urls import KEEPALIVES

Connection = psycopg.Connection[tuple[object, ...]]

#: Quoted rows kept per notifier: an application with a queue per tenant does not grow it forever.
ROWS_KEPT = 1024


def connect(conninfo: str) -> Connection:
    """A new autocommit connection to ``conninfo`` in libpq's non-blocking mode (a committing
    thread writes to it without waiting); raises :class:`psycopg.Error` with nothing left open."""
    conn = psycopg.connect(
        conninfo,
        **KEEPALIVES,
        autocommit=True,
        connect_timeout=5,
        application_name=f"sqla-jobs notifier {os.getpid()}",
    )
    try:
        conn.pgconn.nonblocking = 1
    except psycopg.Error:
        close_quietly(conn)
        raise
    return conn


def close_quietly(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:
        pass


class Statements:
    """Builds the statement that sends a batch of wakeups, quoting each (channel, queue) once."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], bytes] = {}

    def build(self, conn: Connection, batch: list[tuple[str, str]]) -> bytes:
        # Simple-query statements run as one implicit transaction, so SET LOCAL is in force when
        # it commits (and safe behind PgBouncer's transaction pooling). Plain statements, nothing
        # for the server to plan: it answers sooner, and wakes the workers sooner.
        if len(self._rows) > ROWS_KEPT:
            self._rows.clear()
        calls = []
        for wakeup in batch:
            call = self._rows.get(wakeup)
            if call is None:
                channel, queue = (sql.Literal(v).as_bytes(conn) for v in wakeup)
                call = self._rows[wakeup] = b"pg_notify(%s, %s)" % (channel, queue)
            calls.append(call)
        return b"SET LOCAL synchronous_commit TO off; SELECT " + b", ".join(calls)


class Waker:
    """A pipe that wakes the thread from its wait on the connection's socket."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        # One poll object for the thread's life (poll, not select: a busy process's descriptors
        # can be past 1024): a wait is one system call, not a selector made and closed.
        self._poll = select.poll()
        self._poll.register(self._read, select.POLLIN)
        self._sock: int | None = None
        self._mask = 0

    def poke(self) -> None:
        """Wake the thread (the caller checks the pipe is still open: once closed, its numbers
        may belong to others)."""
        try:
            os.write(self._write, b"x")
        except OSError:
            pass

    def wait(self, sock: int | None, write: bool, timeout: float) -> tuple[bool, bool]:
        """Wait up to ``timeout`` seconds for a poke, or for ``sock`` to be readable (or
        writable, with ``write``); whether it is (readable, writable). Called by one thread."""
        mask = select.POLLIN | (select.POLLOUT if write else 0) if sock is not None else 0
        if sock != self._sock or mask != self._mask:
            if self._sock is not None:
                with contextlib.suppress(KeyError, OSError):
                    self._poll.unregister(self._sock)
            if sock is not None:
                self._poll.register(sock, mask)
            self._sock, self._mask = sock, mask
        readable = writable = False
        for fd, events in self._poll.poll(max(0.0, timeout) * 1000.0):
            if fd == self._read:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._read, 4096)
            else:
                if events & select.POLLNVAL:
                    raise OSError("the socket was closed")
                readable = bool(events & (select.POLLIN | select.POLLERR | select.POLLHUP))
                writable = bool(events & select.POLLOUT)
        return readable, writable

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)
