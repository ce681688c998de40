"""The notifier's thread: coalesces the wakeups it is given, sends them one statement at a time
on its own connection, reads the answers and reconnects (why after commit, and on a connection of
its own: :mod:`~sqla_jobs.enqueue.notifier`; its I/O: :mod:`~sqla_jobs.enqueue.notifier_conn`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import pq

from sqla_jobs.db.failover import is_lost_state
from sqla_jobs.enqueue import notifier_conn as _conn

log = logging.getLogger("sqla_jobs.enqueue.insert")
#: What each part of the statement answers when the server took it (the SET, the SELECT).
_ANSWERED = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)

#: The least seconds between two connection attempts: a server that cannot be reached, or that
#: drops each connection at once, is not hammered.
RETRY = 1.0
#: The least seconds between two sends of one process: the first wakeup after a quiet spell
#: leaves at once, the ones that follow within this wait for it, coalesced into one statement.
#: It bounds the NOTIFY transactions a busy process adds to the server's load to 1 / INTERVAL a
#: second; a busy worker claims without being woken, an idle one hears within this.
INTERVAL = 0.01
#: Seconds the thread waits on an idle connection before looking again (a stop pokes it).
CHECK = 5.0
#: Seconds a statement may go unanswered before its connection counts as lost (a peer gone
#: silent behind a NAT drops nothing, and TCP would retransmit for a quarter of an hour).
ANSWER_TIMEOUT = 10.0


class Notifier(threading.Thread):
    """Sends ``pg_notify(channel, queue)`` for what :meth:`send` is given, on its own connection
    to ``conninfo``; one per process and server (:func:`~sqla_jobs.enqueue.notifier.notifier`).

    The committing thread writes the statement to the socket itself (libpq in non-blocking mode:
    no wait, no thread hand-off before the NOTIFY leaves); this thread reads the results, sends
    what arrived meanwhile, and (re)connects. One statement is in flight at a time, and sends
    are at least :data:`INTERVAL` apart.
    """

    def __init__(self, conninfo: str) -> None:
        super().__init__(name="sqla-jobs-notifier", daemon=True)
        self._conninfo = conninfo
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str], None] = {}
        self._batch: list[tuple[str, str]] = []  # in flight
        self._last_start = 0.0  # time.monotonic() of the last send
        self._flushing = False  # the statement is not all written yet
        self._stopping = False
        self._conn: _conn.Connection | None = None  # set when usable
        self._error: bytes | None = None  # the server refused the statement in flight
        self._failing = False
        self._last_connect = -RETRY  # time.monotonic() of the last connection attempt
        self._logs: list[tuple[str, str, tuple[Any, ...], BaseException | None]] = []
        self._waker = _conn.Waker()
        #: The thread has ended and closed its pipe: a lookup for notifier(), where is_alive()
        #: takes the thread's lock, once per enqueuing commit.
        self.ended = False
        self._statements = _conn.Statements()
        #: Statements sent (each carrying one or more wakeups); tests and the bench read it.
        self.sent = 0
        #: Connections made; tests read it.
        self.connects = 0

    def send(self, wakeups: Iterable[tuple[str, str]]) -> None:
        """Send ``wakeups`` ((channel, queue) pairs) now, in one statement, or with the next one
        when a statement is in flight or the interval is not over; never blocks on the
        database."""
        # All pending already (a busy process: most commits between two sends): the statement
        # that takes them out of ``_pending`` starts after this commit, so it carries them. No lock.
        pending = self._pending
        for wakeup in wakeups:
            if wakeup not in pending:
                break
        else:
            return
        with self._cond:
            first = not self._pending
            self._pending.update(dict.fromkeys(wakeups))
            if self._batch or self._conn is None or not self._may_start():
                if first and not self._batch:
                    # The thread connects, or sends when the interval is over; later wakeups
                    # of the same wait ride along without waking it again.
                    self._poke()
                return
            self._start()
        if self._logs:  # read without the lock: a log appended meanwhile goes with the next
            self._emit()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until nothing is pending or in flight."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._batch:
                left = deadline - time.monotonic()
                if left <= 0 or not self.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._poke()

    def _poke(self) -> None:
        # Under the lock: once the thread has ended, its pipe's numbers may belong to others.
        if not self.ended:
            self._waker.poke()

    def _log(self, event: str, message: str, *args: Any, exc: BaseException | None = None) -> None:
        """Log ``event`` after the lock is released (:meth:`_emit`): a handler that enqueues and
        commits would otherwise wait on this lock while holding its own. A failure is a
        warning, anything else information."""
        self._logs.append((event, message, args, exc))

    def _emit(self) -> None:
        with self._cond:
            logs, self._logs = self._logs, []
        for event, message, args, exc in logs:
            level = logging.WARNING if event == "notifier_failed" else logging.INFO
            log.log(level, message, *args, exc_info=exc, extra={"event": event})

    def _start(self) -> None:
        """Write the pending wakeups' statement (under the lock, connected, nothing in flight)."""
        assert self._conn is not None
        batch, self._pending = list(self._pending), {}
        self._batch = batch
        self._last_start = time.monotonic()
        pgconn = self._conn.pgconn
        try:
            pgconn.send_query(self._statement(self._conn, batch))
            self._flushing = pgconn.flush() != 0
        except psycopg.Error as exc:
            self._lost_locked(exc)  # the thread reconnects and sends them
            self._poke()
            return
        if self._flushing:
            self._poke()  # the thread writes the rest when the socket takes it

    def run(self) -> None:
        try:
            while not self._stopping or self._pending or self._batch:
                try:
                    if self._conn is not None:
                        self._serve_once()
                    elif not self._pending:
                        # Connected only while there is something to send: a connection lost
                        # while idle (a restart, a dropped database) costs nothing until the
                        # next wakeup.
                        self._waker.wait(None, False, CHECK)
                    elif not self._connect() and self._stopping:
                        break
                except Exception as exc:  # a bug must not end the wakeups of the process
                    self._lost(exc)
                    with self._cond:  # nor spin, if it happens again at once
                        self._cond.wait_for(lambda: self._stopping, RETRY)
                self._emit()
        finally:
            self._close()
            with self._cond:
                self.ended = True
                self._cond.notify_all()
            self._emit()
            self._waker.close()

    def _serve_once(self) -> None:
        """Wait for the answer in flight, a poke or a writable socket; act on them."""
        with self._cond:
            # A committing thread whose write failed may have dropped the connection already.
            conn = self._conn
            if conn is None:
                return
            pgconn = conn.pgconn
            sock, flushing = pgconn.socket, self._flushing
            timeout = CHECK
            if self._batch:
                timeout = min(CHECK, self._last_start + ANSWER_TIMEOUT - time.monotonic())
            elif self._pending:
                timeout = self._last_start + INTERVAL - time.monotonic()
        try:
            readable, writable = self._waker.wait(sock, flushing, max(0.0, timeout))
        except (OSError, ValueError):
            # The socket closed under us: by a committing thread that dropped the connection
            # (nothing to do), or by the server (handled as a loss below).
            readable = writable = True
        with self._cond:
            if self._conn is not conn:
                return
            try:
                if self._flushing and writable:
                    self._flushing = pgconn.flush() != 0
                if readable:
                    pgconn.consume_input()
                    if pgconn.status != pq.ConnStatus.OK:
                        raise psycopg.OperationalError("the server closed the connection")
                if self._batch and not self._flushing:
                    self._read_results(pgconn)
                if self._batch and time.monotonic() - self._last_start > ANSWER_TIMEOUT:
                    raise psycopg.OperationalError(
                        f"no answer from the server in {ANSWER_TIMEOUT:g}s"
                    )
                if self._pending and not self._batch and self._may_start():
                    self._start()
            except psycopg.Error as exc:
                self._lost_locked(exc)

    def _may_start(self) -> bool:
        return time.monotonic() - self._last_start >= INTERVAL

    def _read_results(self, pgconn: pq.abc.PGconn) -> None:
        """Take what has arrived of the answer, never waiting for more (``get_result`` blocks
        while libpq is busy, and this runs under the lock the committing threads take)."""
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                self._answered(pgconn)
                return
            if result.status not in _ANSWERED:
                self._error = result.error_message or pgconn.error_message or b"refused"
                state = result.error_field(pq.DiagnosticField.SQLSTATE)
                if state is not None and is_lost_state(state.decode(), self._error.decode()):
                    # A server that is not the primary any more (read-only, in recovery):
                    # sent again on this connection it would be refused forever.
                    raise psycopg.OperationalError(self._error.decode(errors="replace").strip())

    def _answered(self, pgconn: pq.abc.PGconn) -> None:
        """The statement in flight is done. One the server refused (a revoked grant, a full
        notification queue) is dropped on a connection that still works: sent again, it would
        be refused again."""
        batch, self._batch = self._batch, []
        error, self._error = self._error, None
        if error is not None:
            if not self._failing:
                self._failing = True
                self._log(
                    "notifier_failed",
                    "the server refused %d wakeup(s) (workers find the jobs by polling): %s",
                    len(batch),
                    error.decode(errors="replace").strip(),
                )
        else:
            self.sent += 1
            if self._failing:
                self._failing = False
                self._log("notifier_back", "wakeups sent again")
        self._cond.notify_all()

    def _connect(self) -> bool:
        # At most one attempt per RETRY (a stop ends the pause): the first after a long-lived
        # connection goes at once, a server that drops every connection is not hammered.
        with self._cond:
            self._cond.wait_for(
                lambda: self._stopping, self._last_connect + RETRY - time.monotonic()
            )
            self._last_connect = time.monotonic()
        try:
            conn = _conn.connect(self._conninfo)
        except psycopg.Error as exc:
            self._lost(exc)
            return False
        with self._cond:
            self.connects += 1
            self._conn = conn
            if self._pending:
                self._start()
        return True

    def _lost(self, exc: BaseException) -> None:
        with self._cond:
            self._lost_locked(exc)

    def _lost_locked(self, exc: BaseException) -> None:
        """The connection failed: drop it, keep what was in flight for the next connection (a
        wakeup sent twice costs a claim that finds nothing), log once per outage. Until the
        server is back, the workers' poll finds the jobs."""
        self._pending.update(dict.fromkeys(self._batch))
        count = len(self._pending)
        self._batch, self._flushing, self._error = [], False, None
        conn, self._conn = self._conn, None
        if conn is not None:
            _conn.close_quietly(conn)
        if count and not self._failing:
            self._failing = True
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._log(
                "notifier_failed",
                "could not send %d wakeup(s) after commit (workers find the jobs by polling): %s",
                count,
                message,
                # A bug's traceback; a lost connection is said in the message.
                exc=None if isinstance(exc, (psycopg.Error, OSError)) else exc,
            )
        self._cond.notify_all()

    def _statement(self, conn: _conn.Connection, batch: list[tuple[str, str]]) -> bytes:
        return self._statements.build(conn, batch)

    def _close(self) -> None:
        with self._cond:
            conn, self._conn = self._conn, None
        if conn is not None:
            _conn.close_quietly(conn)
