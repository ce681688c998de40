"""The reaper thread: returns jobs whose lease expired (their worker died or froze) to the queue.

Any number of workers may reap at once: the reap statement skips rows another reaper (or a
heartbeat) holds. It runs on its own thread and connection, on its own schedule, so it is never
rounded up to a heartbeat tick and never waits behind a renewal. Each queue it puts jobs back into
is notified, so idle workers pick the rescued jobs up at once instead of at their next poll.

After its connection was lost, a reaper holds off for ``grace`` (:func:`reap_grace`) once it is
back: a failover longer than a lease lets every lease run out, and the live workers' heartbeats,
which renew a lease that expired but was not reaped yet, may still be waiting out their reconnect
backoff. Without it the first reaper back would charge every running job a crash for the outage.

Each step also prunes the long-stale rows of the registry of live workers
(:mod:`sqla_jobs.observe.registry`) and writes the worker's throughput counts
(:mod:`sqla_jobs.observe.tally`): on this connection, at this cadence, so neither costs a
connection or thread of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqla_jobs.db.connections import (
    RECONNECT_CAP,
    THREAD_CONNECT_TIMEOUT,
    Conn,
    ConnectionThread,
    Connector,
)
from sqla_jobs.sql.compiled import WorkerSQL

log = logging.getLogger("sqla_jobs.worker")

#: Rows reaped per statement: a short transaction, whatever the backlog.
_BATCH = 100


def reap_grace(lease: float, heartbeat: float) -> float:
    """How long a reaper back from a lost connection holds off: the latest another worker's
    heartbeat thread may renew after the same outage (its longest backoff, one connection attempt,
    one beat) plus a lease, so the reaper never charges a live worker's run for the outage."""
    return lease + RECONNECT_CAP + THREAD_CONNECT_TIMEOUT + heartbeat


class Reaper(ConnectionThread):
    """Every ``interval`` seconds, call ``beat`` (if any) on its connection, reap every expired lease (in
    batches) and wake the queues they go back to through ``channel``; ``on_reaped(kind, queue)``
    hears each job reaped (the metrics' crash counter)."""

    def __init__(
        self,
        *,
        connector: Connector,
        sql: WorkerSQL,
        interval: float,
        channel: str,
        beat: Callable[[Conn], object] | None = None,
        on_reaped: Callable[[str, str], None] | None = None,
        grace: float = 0.0,
    ) -> None:
        super().__init__(connector, "reaper", what="reaper connection", event="lease_conn_lost")
        self._sql = sql
        self._interval = interval
        self._channel = channel
        self._beat = beat
        self._on_reaped = on_reaped
        self._grace = grace
        #: The connection was lost: once back, hold off reaping until ``_hold_until``.
        self._was_lost = False
        self._hold_until = 0.0
        self.reaped = 0
        #: Completed passes (registry pruning, counts, reap); tests watch it.
        self.passes = 0

    def step(self) -> float:
        conn = self.connection()
        if self._was_lost:
            self._was_lost = False
            self._hold_until = time.monotonic() + self._grace
        if self._beat is not None:
            self._beat(conn)
        if time.monotonic() >= self._hold_until:
            self.reap()
        self.passes += 1
        return self._interval

    def _close(self) -> None:
        self._was_lost = True
        super()._close()

    def reap(self) -> int:
        """Return expired leases to the queue (or dead), wake their queues; the number reaped."""
        total = 0
        woken: set[str] = set()
        conn = self.connection()
        while True:
            rows = conn.execute(self._sql.reap.sql, self._sql.reap.params(limit=_BATCH)).fetchall()
            for job_id, kind, state, crashes, locked_by, queue in rows:
                log.warning(
                    "reaped job %s (%s) from worker %s: crash %s, now %s",
                    job_id,
                    kind,
                    locked_by,
                    crashes,
                    state,
                    extra={"event": "reaped", "job_id": job_id, "kind": kind, "state": state},
                )
                if self._on_reaped is not None:
                    self._on_reaped(str(kind), str(queue))
                if state == "pending" and queue not in woken:
                    # After the reap committed (autocommit): a woken worker sees the rows.
                    conn.execute(
                        self._sql.notify.sql,
                        self._sql.notify.params(channel=self._channel, queue=queue),
                    )
                    woken.add(str(queue))
            total += len(rows)
            if len(rows) < _BATCH:
                break
        self.reaped += total
        return total
