"""The per-process notifier: sends enqueue wakeups after the enqueuing transaction committed.

A ``pg_notify`` inside the application's transaction makes its COMMIT take PostgreSQL's
cluster-wide notification-queue lock and hold it until the commit record is flushed, which
serializes every enqueuing commit. Here the NOTIFY goes out on a connection of its own, after the
commit, in a transaction with ``synchronous_commit`` off: the lock is held for microseconds and no
application commit waits on it. Wakeups that arrive while a send is in flight, or within
:data:`INTERVAL` of the last one, are coalesced into the next statement, so the notifier never
falls behind and a busy process adds at most 1 / INTERVAL small transactions a second.

A wakeup is a hint: workers poll as a floor, and every (re)connect of their listener looks once.
So a send that fails is logged (once per outage) and dropped, and a process that dies between its
commit and the send only delays the job to the next poll.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Iterable

import psycopg
from psycopg import pq, sql

log = logging.getLogger("sqla_jobs.enqueue")

#: Seconds between two connection attempts while the server cannot be reached.
RETRY = 1.0
#: The least seconds between two sends of one process: the first wakeup after a quiet spell
#: leaves at once, the ones that follow within this wait for it, coalesced into one statement.
#: It bounds the NOTIFY transactions a busy process adds to the server's load to 1 / INTERVAL a
#: second; a busy worker claims without being woken, an idle one hears within this.
INTERVAL = 0.01
#: Seconds the thread waits on an idle connection before looking again (a stop pokes it).
CHECK = 5.0


class Notifier(threading.Thread):
    """Sends ``pg_notify(channel, queue)`` for what :meth:`send` is given, on its own connection
    to ``conninfo``; one per process and server (:func:`notifier`).

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
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None  # set when usable
        self._failing = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        #: Each wakeup's (channel, queue) row, quoted once.
        self._rows: dict[tuple[str, str], bytes] = {}
        #: Statements sent (each carrying one or more wakeups); tests and the bench read it.
        self.sent = 0

    def send(self, wakeups: Iterable[tuple[str, str]]) -> None:
        """Send ``wakeups`` ((channel, queue) pairs) now, in one statement, or with the next one
        when a statement is in flight or the interval is not over; never blocks on the
        database."""
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
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _drain_pokes(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)

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
                if self._conn is None:
                    # Connected only while there is something to send: a connection lost while
                    # idle (a restart, a dropped database) costs nothing until the next wakeup.
                    if not self._pending:
                        select.select([self._wake_r], [], [], CHECK)
                        self._drain_pokes()
                    elif not self._connect() and self._stopping:
                        break
                    continue
                self._serve_once()
        finally:
            self._close()
            with self._cond:
                self._cond.notify_all()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _serve_once(self) -> None:
        """Wait for the answer in flight, a poke or a writable socket; act on them."""
        assert self._conn is not None
        pgconn = self._conn.pgconn
        writing = [pgconn.socket] if self._flushing else []
        timeout = CHECK
        if self._pending and not self._batch:
            timeout = max(0.0, self._last_start + INTERVAL - time.monotonic())
        try:
            readable, writable, _ = select.select(
                [pgconn.socket, self._wake_r], writing, [], timeout
            )
        except (OSError, ValueError) as exc:
            self._lost(exc)
            return
        if self._wake_r in readable:
            self._drain_pokes()
        with self._cond:
            try:
                if self._flushing and writable:
                    self._flushing = pgconn.flush() != 0
                if pgconn.socket in readable:
                    pgconn.consume_input()
                    if pgconn.status != pq.ConnStatus.OK:
                        raise psycopg.OperationalError("the server closed the connection")
                if self._batch and not self._flushing and not pgconn.is_busy():
                    self._answered(pgconn)
                if self._pending and not self._batch and self._may_start():
                    self._start()
            except psycopg.Error as exc:
                self._lost_locked(exc)

    def _may_start(self) -> bool:
        return time.monotonic() - self._last_start >= INTERVAL

    def _answered(self, pgconn: pq.abc.PGconn) -> None:
        error = None
        while (result := pgconn.get_result()) is not None:
            if result.status != pq.ExecStatus.TUPLES_OK:
                error = result.error_message or pgconn.error_message
        if error is not None:
            raise psycopg.OperationalError(error.decode(errors="replace").strip())
        self._batch = []
        self.sent += 1
        if self._failing:
            self._failing = False
            log.info("wakeups sent again", extra={"event": "notifier_back"})
        self._cond.notify_all()

    def _connect(self) -> bool:
        try:
            conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=5,
                application_name=f"sqla-jobs notifier {os.getpid()}",
            )
            conn.pgconn.nonblocking = 1
        except psycopg.Error as exc:
            self._lost(exc)
            return False
        with self._cond:
            self._conn = conn
            if self._pending:
                self._start()
        return True

    def _lost(self, exc: BaseException) -> None:
        with self._cond:
            self._lost_locked(exc)
        if not self._stopping:
            # A server that cannot be reached is not hammered; a stop ends the pause.
            with self._cond:
                self._cond.wait_for(lambda: self._stopping, RETRY)

    def _lost_locked(self, exc: BaseException) -> None:
        """The connection failed: drop it, keep what was in flight for the next connection (a
        wakeup sent twice costs a claim that finds nothing), log once per outage. Until the
        server is back, the workers' poll finds the jobs."""
        self._pending.update(dict.fromkeys(self._batch))
        count = len(self._pending)
        self._batch, self._flushing = [], False
        conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)
        if count and not self._failing:
            self._failing = True
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning(
                "could not send %d wakeup(s) after commit (workers find the jobs by polling): %s",
                count,
                message,
                extra={"event": "notifier_failed"},
            )
        self._cond.notify_all()

    def _statement(
        self, conn: psycopg.Connection[tuple[object, ...]], batch: list[tuple[str, str]]
    ) -> bytes:
        # One statement, its own implicit transaction: set_config(..., true) is SET LOCAL, in
        # force when that transaction commits (and safe behind PgBouncer's transaction pooling).
        rows = []
        for wakeup in batch:
            row = self._rows.get(wakeup)
            if row is None:
                channel, queue = (sql.Literal(v).as_bytes(conn) for v in wakeup)
                row = self._rows[wakeup] = b"(%s, %s)" % (channel, queue)
            rows.append(row)
        return (
            b"SELECT pg_notify(c, q) FROM (SELECT set_config('synchronous_commit', 'off', true))"
            b" AS lax, (VALUES %s) AS w (c, q)" % b", ".join(rows)
        )

    def _close(self) -> None:
        with self._cond:
            conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)


def _close_quietly(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    try:
        conn.close()
    except Exception:
        pass


_lock = threading.Lock()
_notifiers: dict[str, Notifier] = {}
#: What a forked child inherited: never used, never closed (closing would end the parent's
#: connection, whose socket the child shares), only kept from the garbage collector.
_inherited: list[Notifier] = []


def notifier(conninfo: str) -> Notifier:
    """This process's notifier for ``conninfo``, started on first use."""
    found = _notifiers.get(conninfo)
    if found is not None:
        return found
    with _lock:
        found = _notifiers.get(conninfo)
        if found is None:
            found = _notifiers[conninfo] = Notifier(conninfo)
            found.start()
    return found


def flush_all(timeout: float = 2.0) -> bool:
    """Wait until every notifier of this process has sent what it was given (at most
    ``timeout`` seconds in all); whether they all did."""
    deadline = time.monotonic() + timeout
    return all(
        [each.flush(max(0.0, deadline - time.monotonic())) for each in list(_notifiers.values())]
    )


def _at_exit() -> None:
    # A script that enqueues and ends still wakes the workers.
    flush_all()
    for each in list(_notifiers.values()):
        each.stop()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _inherited.extend(_notifiers.values())
    _notifiers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
