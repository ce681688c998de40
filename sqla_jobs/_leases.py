"""The lease thread: heartbeats for this worker's running jobs, and the reaper for everyone's.

It runs in its own OS thread on its own connection, so neither a handler that blocks the event loop
nor a slow claim can starve a heartbeat. Reaping is safe with any number of workers doing it at
once: the reap statement skips rows another reaper holds.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import psycopg

from ._connections import CONNECTION_ERRORS, close_quietly, reconnect_delay
from ._db import KEEPALIVES
from ._sql import WorkerSQL

log = logging.getLogger("sqla_jobs.worker")


Snapshot = Callable[[], dict[int, uuid.UUID]]
OnLost = Callable[[set[int]], None]


class LeaseKeeper(threading.Thread):
    """Every ``heartbeat`` seconds: extend the leases of ``snapshot()``'s jobs, report the ones whose
    lease was lost through ``on_lost``; every ``reap_interval`` seconds: reap expired leases."""

    def __init__(
        self,
        *,
        conninfo: str,
        application_name: str,
        sql: WorkerSQL,
        lease: timedelta,
        heartbeat: float,
        reap_interval: float,
        snapshot: Snapshot,
        on_lost: OnLost,
        name: str,
        prepare_threshold: int | None = 5,
    ) -> None:
        super().__init__(name=f"sqla-jobs-leases-{name}", daemon=True)
        self._conninfo = conninfo
        self._application_name = application_name
        self._prepare_threshold = prepare_threshold
        self._sql = sql
        self._lease = lease
        self._heartbeat = heartbeat
        self._reap_interval = reap_interval
        self._snapshot = snapshot
        self._on_lost = on_lost
        self._stop_event = threading.Event()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        #: Test hook: while set, heartbeats are skipped (simulates a frozen worker).
        self.frozen = threading.Event()
        self.reaped = 0

    def stop(self) -> None:
        """Ask the thread to finish its current step and exit."""
        self._stop_event.set()

    def run(self) -> None:
        next_reap = 0.0
        failures = 0
        while not self._stop_event.is_set():
            try:
                if not self.frozen.is_set():
                    self.beat()
                if time.monotonic() >= next_reap:
                    self.reap()
                    next_reap = time.monotonic() + self._reap_interval
                failures = 0
                wait = self._heartbeat
            except CONNECTION_ERRORS as exc:
                failures += 1
                wait = reconnect_delay(failures)
                log.warning(
                    "lease connection lost, reconnecting in %.1fs: %s",
                    wait,
                    exc,
                    extra={"event": "lease_conn_lost"},
                )
                self._close()
            self._stop_event.wait(wait)
        self._close()

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._conninfo,
                **KEEPALIVES,
                autocommit=True,
                connect_timeout=5,
                application_name=self._application_name,
                prepare_threshold=self._prepare_threshold,
            )
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)

    def beat(self) -> None:
        """Extend the leases of the jobs running now; report the lost ones."""
        held = self._snapshot()
        if not held:
            return
        ids = list(held)
        rows = (
            self._connection()
            .execute(
                self._sql.heartbeat.sql,
                self._sql.heartbeat.params(
                    ids=ids, tokens=list(set(held.values())), lease=self._lease
                ),
            )
            .fetchall()
        )
        kept = {int(r[0]) for r in rows}  # type: ignore[call-overload]
        lost = set(ids) - kept
        if lost:
            self._on_lost(lost)

    def reap(self) -> int:
        """Return expired leases to the queue (or dead); the number reaped."""
        total = 0
        while True:
            rows = (
                self._connection()
                .execute(self._sql.reap.sql, self._sql.reap.params(limit=100))
                .fetchall()
            )
            for job_id, kind, state, crashes, locked_by in rows:
                log.warning(
                    "reaped job %s (%s) from worker %s: crash %s, now %s",
                    job_id,
                    kind,
                    locked_by,
                    crashes,
                    state,
                    extra={"event": "reaped", "job_id": job_id, "kind": kind, "state": state},
                )
            total += len(rows)
            if len(rows) < 100:
                break
        self.reaped += total
        return total
