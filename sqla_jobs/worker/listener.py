"""The dedicated LISTEN connection, in its own thread: wakes the worker when a job is enqueued.

LISTEN is session state, so it never lives on a pooled connection. NOTIFY is fire-and-forget: a
notification sent while the listener is disconnected is gone, which is why polling stays the floor
and why every (re)connect reports a wakeup. A half-open connection (the server vanished without a
FIN) is detected by a liveness query after each quiet period, which the kernel fails within
``check_timeout`` (``tcp_user_timeout``) if the server never acknowledges it.

The thread blocks on the socket itself, so a notification is acted on the moment it arrives,
without waiting for a turn of the worker's event loop: ``on_notify`` runs in this thread and may
use the connection (the worker claims on it when it is idle, the shortest path from a COMMIT to a
running handler).
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections.abc import Callable, Collection

import psycopg
from psycopg import sql

from sqla_jobs.db.connections import Connector, Reconnects, close_quietly, serve
from sqla_jobs.enqueue.payloads import parse_due
from sqla_jobs.sql.claim import LISTEN_SESSION

log = logging.getLogger("sqla_jobs.worker")

Connection = psycopg.Connection[tuple[object, ...]]
#: Called in the listener's thread with the connection and the notified queues (in the order
#: they arrived); with no queues after every (re)connect, when anything may have been missed.
OnNotify = Callable[[Connection, list[str]], None]


class Listener(threading.Thread):
    """Listen on ``channel``; call ``on_notify`` for notifications naming one of ``queues`` and after
    every (re)connect, and ``on_due`` with the seconds of a ``due`` notification for one of them
    (:mod:`~sqla_jobs.enqueue.payloads`). Reconnects with capped exponential backoff until
    :meth:`stop`."""

    def __init__(
        self,
        connector: Connector,
        channel: str,
        queues: Collection[str],
        on_notify: OnNotify,
        *,
        check_interval: float = 5.0,
        check_timeout: float = 5.0,
        max_backoff: float = 5.0,
        cancel_channel: str | None = None,
        on_cancel: Callable[[list[int]], None] | None = None,
        on_due: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(name=f"sqla-jobs-listen-{connector.worker}", daemon=True)
        self._connector = connector
        self._channel = channel
        self._queues = frozenset(queues)
        self._on_notify = on_notify
        self._cancel_channel = cancel_channel
        self._on_cancel = on_cancel
        self._on_due = on_due
        self._check_interval = check_interval
        self._check_timeout = check_timeout
        self._max_backoff = max_backoff
        self.connected = threading.Event()
        #: How many times the connection was (re)established (counted after its first look, when
        #: ``connected`` is set); tests watch it.
        self.connects = 0
        self._reconnects = Reconnects(
            "LISTEN connection (polling meanwhile)", "listener_lost", first=0.05, cap=max_backoff
        )
        self._conn: Connection | None = None
        #: Notified queues not acted on yet, in arrival order: psycopg hands us the notifications
        #: it reads, while we wait and while on_notify's statements run.
        self._notes: list[str] = []
        self._stopping = threading.Event()
        # stop() writes a byte to this pipe: the thread's select() returns at once. Created and
        # closed by the thread, under the lock, so stop() never writes to a closed descriptor.
        self._pipe_lock = threading.Lock()
        self._stop_r = self._stop_w = -1

    def stop(self) -> None:
        """Ask the thread to close its connection and exit (at once, unless ``on_notify`` runs)."""
        with self._pipe_lock:
            self._stopping.set()
            if self._stop_w >= 0:
                os.write(self._stop_w, b"x")

    def run(self) -> None:
        with self._pipe_lock:
            if self._stopping.is_set():
                return
            self._stop_r, self._stop_w = os.pipe()
        try:
            serve(
                self._stopping,
                self._listen,
                self._reconnects,
                close=self._close,
                wait=self._wait,
                errors=(psycopg.Error, OSError),
            )
        finally:
            self._close()
            with self._pipe_lock:
                os.close(self._stop_r)
                os.close(self._stop_w)
                self._stop_r = self._stop_w = -1

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, or until stopped."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._stop_r, selectors.EVENT_READ)
            selector.select(seconds)

    def _connect(self) -> Connection:
        conn = self._connector.connect(
            "listen",
            connect_timeout=5,
            # A statement the server never acknowledges (a half-open connection) fails after this.
            tcp_user_timeout=int(self._check_timeout * 1000),
        )
        # Settings for the claim it makes when woken (see LISTEN_SESSION).
        try:
            conn.execute(LISTEN_SESSION)
        except BaseException:
            close_quietly(conn)
            raise
        conn.add_notify_handler(self._note)
        return conn

    def _note(self, note: psycopg.Notify) -> None:
        if note.channel == self._cancel_channel:
            if self._on_cancel is not None:
                ids = [int(i) for i in note.payload.split(",") if i.isdigit()]
                self._on_cancel(ids)
        elif note.payload in self._queues:
            self._notes.append(note.payload)
        elif self._on_due is not None:
            # Any other payload (a form of a later release, a stray NOTIFY) is ignored.
            due = parse_due(note.payload)
            if due is not None and due[0] in self._queues:
                self._on_due(due[1])

    def _listen(self) -> float:
        """Connect, LISTEN, and act on notifications until stopped (then 0: no pause before the
        loop sees the stop) or the connection is lost (raises)."""
        conn = self._conn = self._connect()
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        if self._cancel_channel is not None:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._cancel_channel)))
        # Anything enqueued before the LISTEN (or while we were away) was announced to nobody:
        # look once. Only then are we connected: from then on, a NOTIFY finds us.
        self._on_notify(conn, [])
        self._notes.clear()
        # Every logged loss gets its "back", even one before the first connection was whole.
        if self._reconnects.failures or self.connects:
            log.info("LISTEN connection re-established", extra={"event": "listener_back"})
        # Connected again: the next loss starts the backoff over, however many came before.
        self._reconnects.ok(conn)
        self.connected.set()
        self.connects += 1
        # A selector, not select(): a descriptor past FD_SETSIZE (an application with a thousand
        # open files) is fine here.
        with selectors.DefaultSelector() as selector:
            selector.register(conn.pgconn.socket, selectors.EVENT_READ)
            selector.register(self._stop_r, selectors.EVENT_READ)
            self._serve(conn, selector)
        return 0.0

    def _serve(self, conn: Connection, selector: selectors.BaseSelector) -> None:
        """Act on notifications until stopped; raises when the connection is lost."""
        pgconn = conn.pgconn
        quiet_since = time.monotonic()
        while not self._stopping.is_set():
            if self._notes:
                queues = list(dict.fromkeys(self._notes))
                self._notes.clear()
                self._on_notify(conn, queues)
                quiet_since = time.monotonic()
                continue
            left = quiet_since + self._check_interval - time.monotonic()
            if left <= 0:
                # A quiet period: prove the connection is alive (see tcp_user_timeout).
                conn.execute("SELECT 1")
                self._reconnects.ok(conn)
                quiet_since = time.monotonic()
                continue
            ready = selector.select(left)
            if any(key.fd == pgconn.socket for key, _ in ready):
                # Straight from libpq: no query runs on this connection now, and its notification
                # handler (_note) is what psycopg would call for them.
                pgconn.consume_input()
                # The server spoke: the connection works (a later loss is news, not an echo).
                self._reconnects.ok(conn)
                while (raw := pgconn.notifies()) is not None:
                    if pgconn.notify_handler is not None:
                        pgconn.notify_handler(raw)
                quiet_since = time.monotonic()

    def _close(self) -> None:
        self.connected.clear()
        conn, self._conn = self._conn, None
        close_quietly(conn)
