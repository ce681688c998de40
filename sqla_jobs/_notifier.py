"""The per-process notifier: sends enqueue wakeups after the enqueuing transaction committed.

A ``pg_notify`` inside the application's transaction makes its COMMIT take PostgreSQL's
cluster-wide notification-queue lock and hold it until the commit record is flushed, which
serializes every enqueuing commit. Here the NOTIFY goes out on a connection of its own, after the
commit, in a transaction with ``synchronous_commit`` off: the lock is held for microseconds and no
application commit waits on it. Wakeups that arrive while a send is in flight are coalesced into
the next one (one statement per (channel, queue) set), so the notifier never falls behind.

A wakeup is a hint: workers poll as a floor, and every (re)connect of their listener looks once.
So a send that fails is logged (once per outage) and dropped, and a process that dies between its
commit and the send only delays the job to the next poll.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

import psycopg
from psycopg import pq, sql

log = logging.getLogger("sqla_jobs.enqueue")

#: Seconds between two connection attempts while the server cannot be reached.
RETRY = 1.0


class Notifier(threading.Thread):
    """Sends ``pg_notify(channel, queue)`` for what :meth:`send` is given, on its own connection
    to ``conninfo``, as soon as it can; one per process and server (:func:`notifier`)."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(name="sqla-jobs-notifier", daemon=True)
        self._conninfo = conninfo
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str], None] = {}
        self._sending = False
        self._stopping = False
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._failing = False
        #: Each wakeup's (channel, queue) row, quoted once.
        self._rows: dict[tuple[str, str], bytes] = {}
        #: Statements sent (each carrying one or more wakeups); tests and the bench read it.
        self.sent = 0

    def send(self, channel: str, queues: list[str]) -> None:
        """Queue a wakeup of ``queues`` on ``channel``; never blocks on the database."""
        with self._cond:
            for queue in queues:
                self._pending[(channel, queue)] = None
            self._cond.notify()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until nothing is pending or in flight."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._sending:
                left = deadline - time.monotonic()
                if left <= 0 or not self.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()
                    while not self._pending and not self._stopping:
                        self._cond.wait()
                    if not self._pending:
                        return
                    batch, self._pending = list(self._pending), {}
                    self._sending = True
                self._send(batch)
        finally:
            self._close()

    def _send(self, batch: list[tuple[str, str]]) -> None:
        for attempt in (1, 2):
            try:
                conn = self._connect()
                # Sent by libpq directly: the GIL is released for the round trip, and the
                # application's threads keep it.
                result = conn.pgconn.exec_(self._statement(conn, batch))
                if result.status != pq.ExecStatus.TUPLES_OK:
                    raise psycopg.OperationalError(
                        (result.error_message or conn.pgconn.error_message).decode(errors="replace")
                    )
                self.sent += 1
                if self._failing:
                    self._failing = False
                    log.info("wakeups sent again", extra={"event": "notifier_back"})
                return
            except (psycopg.Error, OSError) as exc:
                self._close()
                if attempt == 2 or self._stopping:
                    self._lost(exc, len(batch))
                    return

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

    def _lost(self, exc: BaseException, count: int) -> None:
        if not self._failing:
            self._failing = True
            log.warning(
                "could not send %d wakeup(s) after commit (workers find the jobs by polling): %s",
                count,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                extra={"event": "notifier_failed"},
            )
        with self._cond:
            # Pause before the next try, unless stopping: a server that is down is not hammered.
            self._cond.wait_for(lambda: self._stopping, RETRY)

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=5,
                application_name=f"sqla-jobs notifier {os.getpid()}",
            )
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
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
