"""The reaper thread: returns jobs whose lease expired (their worker died or froze) to the queue.

Any number of workers may reap at once: the reap statement skips rows another reaper (or a
heartbeat) holds. It runs on its own thread and connection, on its own schedule, so it is never
rounded up to a heartbeat tick and never waits behind a renewal. Each queue it puts jobs back into
is notified, so idle workers pick the rescued jobs up at once instead of at their next poll.

Each step also prunes the long-stale rows of the registry of live workers
(:mod:`sqla_jobs.observe.registry`) and writes the worker's throughput counts
(:mod:`sqla_jobs.observe.tally`): on this connection, at this cadence, so neither costs a
connection or thread of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqla_jobs.db.connections import Conn, ConnectionThread, Connector
from sqla_jobs.sql.compiled import WorkerSQL

log = logging.getLogger("sqla_jobs.worker")

#: Rows reaped per statement: a short transaction, whatever the backlog.
_BATCH = 100


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
    ) -> None:
        super().__init__(connector, "reaper", what="reaper connection", event="lease_conn_lost")
        self._sql = sql
        self._interval = interval
        self._channel = channel
        self._beat = beat
        self._on_reaped = on_reaped
        self.reaped = 0
        #: Completed passes (registry pruning, counts, reap); tests watch it.
        self.passes = 0

    def step(self) -> float:
        if self._beat is not None:
            self._beat(self.connection())
        self.reap()
        self.passes += 1
        return self._interval

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
