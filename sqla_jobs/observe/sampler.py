"""The queue sampler thread of a worker with metrics: one worker across all machines samples the
queues' depth every interval, and only that worker's ``/metrics`` shows it.

The election is the pruner's (:mod:`sqla_jobs.worker.pruner`): a *session-level* advisory lock tried
without waiting, on the sampler's own connection. Unlike the pruner, the winner keeps it for as
long as its connection lives, so the gauges come from one worker, steadily, rather than from a
different one at each interval; the others try again each interval and take over within one
interval of the holder's connection ending (a stop, a crash, a lost network: the server releases
a session lock when the session ends). A worker that does not hold the lock exposes no depth
gauges, so summing a gauge over every scraped worker counts each queue once.

A sample is one read of the queues (:func:`sqla_jobs.sql.metrics.sample_queues`), which never
reads the jobs scheduled for later, and two of small tables (paused queues, schedules' lag). The
count of scheduled jobs reads an index entry per job (up to a cap per queue), so it is taken
every five minutes and its rows are repeated in the samples between. The jobs waiting on their
parents are estimated from the planner's statistics (:func:`~sqla_jobs.sql.metrics.estimate_waiting`):
no index holds them, and a count would read every one of a large waiting backlog each sample.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import psycopg

from sqla_jobs.db.connections import ConnectionThread, Connector, should_reconnect
from sqla_jobs.sql import metrics as metrics_sql
from sqla_jobs.sql.compiled import compile_statement
from sqla_jobs.sql.tables import job_table_name

log = logging.getLogger("sqla_jobs.worker")

#: A sample's rows: (queue, state, jobs, oldest due age in seconds or None).
Rows = list[tuple[Any, ...]]
#: Seconds between two counts of the scheduled jobs: the one read that grows with them (up to
#: its cap), so its cost is spread thin.
SCHEDULED_EVERY = 300.0


class Sample(NamedTuple):
    """One interval's reads: the queues' rows (due, by state, ``paused``, ``scheduled``), each
    unpaused schedule's (name, seconds its next tick is overdue), and the jobs waiting on their
    parents, estimated from the planner's statistics (None: not read)."""

    queues: Rows
    schedules: list[tuple[str, float]]
    waiting: int | None = None


class Sampler(ConnectionThread):
    """Every ``interval`` seconds: if this worker holds (or wins) the sampler's lock of the queue
    table in ``schema``, sample the queues and hand the rows to ``on_sample``; else hand it None
    (this worker shows no depth)."""

    def __init__(
        self,
        *,
        connector: Connector,
        schema: str | None,
        interval: float,
        on_sample: Callable[[Sample | None], None],
    ) -> None:
        super().__init__(connector, "sampler", what="sampler connection", event="sampler_conn_lost")
        self._try_lock = compile_statement(metrics_sql.try_lock_sampler(), schema)
        self._sample = compile_statement(metrics_sql.sample_queues(), schema)
        self._paused = compile_statement(metrics_sql.sample_paused_queues(), schema)
        self._lags = compile_statement(metrics_sql.sample_schedule_lags(), schema)
        self._scheduled = compile_statement(metrics_sql.count_scheduled(), schema)
        self._waiting = compile_statement(metrics_sql.estimate_waiting(), schema)
        self._job_table = job_table_name(schema)
        #: The latest count of scheduled jobs, and when it was taken (monotonic; 0: never).
        self._scheduled_rows: Rows = []
        self._scheduled_at = 0.0
        self._schema = schema
        self._interval = interval
        self._on_sample = on_sample
        #: This worker's connection holds the lock: it is the sampler.
        self.elected = False
        self.samples = 0

    def step(self) -> float:
        try:
            self.sample_once()
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
            # A statement timeout, a refused read: this interval shows nothing, the next tries.
            self._on_sample(None)
            log.warning(
                "sampling the queues failed, next try in %gs: %s: %s",
                self._interval,
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                extra={"event": "sample_failed"},
            )
        return self._interval

    def sample_once(self) -> Sample | None:
        """One interval's work: the sample, or None if another worker is the sampler."""
        conn = self.connection()
        if not self.elected:
            params = self._try_lock.params(schema_name=self._schema)
            found = conn.execute(self._try_lock.sql, params).fetchone()
            self.elected = bool(found and found[0])
            if self.elected:
                log.info(
                    "worker %s samples the queues for the metrics",
                    self._connector.worker,
                    extra={"event": "sampler_elected"},
                )
        if self.elected:
            rows: Rows = conn.execute(self._sample.sql, self._sample.params()).fetchall()
            rows += conn.execute(self._paused.sql, self._paused.params()).fetchall()
            now = time.monotonic()
            if not self._scheduled_at or now - self._scheduled_at >= SCHEDULED_EVERY:
                self._scheduled_rows = conn.execute(
                    self._scheduled.sql, self._scheduled.params()
                ).fetchall()
                self._scheduled_at = now
            rows += self._scheduled_rows
            ticks: Rows = conn.execute(self._lags.sql, self._lags.params()).fetchall()
            lags = [(str(name), float(lag)) for name, lag in ticks]
            params = self._waiting.params(job_table=self._job_table)
            waiting: tuple[Any, ...] | None = conn.execute(self._waiting.sql, params).fetchone()
            sample = Sample(rows, lags, int(waiting[0]) if waiting else None)
            self.samples += 1
            self._on_sample(sample)
            return sample
        self._on_sample(None)
        return None

    def _close(self) -> None:
        # The lock goes with the session: whatever was sampled is no longer this worker's to show.
        self.elected = False
        self._scheduled_at = 0.0
        self._on_sample(None)
        super()._close()
