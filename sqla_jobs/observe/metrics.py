"""Prometheus metrics of a worker: the implementation of :mod:`sqla_jobs.metrics`."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge

from sqla_jobs.context import due_at
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.hooks import _name_of
from sqla_jobs.observe.collectors import (
    DURATION_BUCKETS,
    OUTCOME_AT,
    OUTCOMES,
    PICKUP_BUCKETS,
    QueueCollector,
    RunCollector,
)

if TYPE_CHECKING:
    from sqla_jobs._outcome import Outcome
    from sqla_jobs.context import ClaimedJob
    from sqla_jobs.observe.metrics_http import HealthCheck, MetricsServer

log = logging.getLogger("sqla_jobs.worker")


class Metrics:
    """The Prometheus collectors of one worker, registered in ``registry`` (default: a registry of
    their own; pass ``prometheus_client.REGISTRY`` to show them with your application's metrics).

    With ``port`` the worker serves them itself while it runs, on ``host`` (default
    ``127.0.0.1``: only the machine itself, or a sidecar, can scrape; ``0.0.0.0`` for every
    interface): ``/metrics`` in Prometheus' text format, and ``/healthz``, 200 while the worker
    runs its loop and 503 when it is starting, stopping, blocked or stuck. ``port=0`` takes a
    free port (:attr:`address` says which). The queues' depth is sampled every
    ``sample_interval`` seconds by one worker at a time (see :mod:`sqla_jobs.observe.sampler`); None:
    this worker never samples (behind PgBouncer in transaction pooling, where the election's
    session lock has no session to live in, sample from a worker that connects directly).

    One :class:`Metrics` per worker: the collectors count what that worker does. Registering
    two in one registry raises prometheus_client's ``ValueError`` (duplicated timeseries).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        sample_interval: float | None = 15.0,
    ) -> None:
        if port is not None and not 0 <= port <= 65535:
            raise ConfigurationError(f"metrics port must be 0 to 65535, got {port}")
        if sample_interval is not None and not sample_interval > 0:
            raise ConfigurationError(
                f"metrics sample_interval must be > 0 seconds, got {sample_interval}"
            )
        self.registry = registry if registry is not None else CollectorRegistry()
        self.port = port
        self.host = host
        self.sample_interval = sample_interval
        #: The runs' counters and histograms (kept by the worker's loop, read at each scrape).
        self.runs = RunCollector()
        self.registry.register(self.runs)
        self.running = Gauge(
            "sqla_jobs_worker_running_jobs",
            "Handlers this worker runs now",
            registry=self.registry,
        )
        self.queues = QueueCollector(sample_interval or 0.0)
        self.registry.register(self.queues)
        self._server: MetricsServer | None = None
        self._health: HealthCheck = lambda: (False, "not started")

    @property
    def address(self) -> tuple[str, int] | None:
        """Where ``/metrics`` is served, once the worker started: (host, port); else None."""
        return None if self._server is None else self._server.address

    # -- what the worker tells (see sqla_jobs.observe.runs.Observer) ------------------------------

    def started(self, job: ClaimedJob, now: float) -> None:
        """``job``'s handler starts now: its pickup delay. On the worker's loop."""
        runs = self.runs.of(job.kind, job.queue)
        delay = now - due_at(job)
        if delay < 0.0:
            delay = 0.0
        runs.pickups[bisect_left(PICKUP_BUCKETS, delay)] += 1
        runs.pickup_sum += delay

    def ended(self, outcome: Outcome, ran: bool) -> None:
        """A run ended: its outcome, and its duration if it ran. On the worker's loop."""
        job = outcome.job
        runs = self.runs.of(job.kind, job.queue)
        runs.outcomes[OUTCOME_AT[_name_of(outcome)]] += 1
        if outcome.cancel_ignored:
            key = (job.kind, job.queue)
            ignored = self.runs.cancels_ignored
            ignored[key] = ignored.get(key, 0) + 1
        if ran:
            took = outcome.runtime
            runs.durations[bisect_left(DURATION_BUCKETS, took)] += 1
            runs.duration_sum += took

    def reaped(self, kind: str, queue: str) -> None:
        """This worker's reaper found a job of ``kind`` in ``queue`` under an expired lease. On
        the reaper's thread (the only one that writes the crash counts)."""
        key = (kind, queue)
        self.runs.crashes[key] = self.runs.crashes.get(key, 0) + 1

    # -- the worker's side (private) --------------------------------------------------------

    def _attach(
        self,
        *,
        health: HealthCheck,
        running: Callable[[], int],
        kinds: Iterable[tuple[str, str]],
        queues: Sequence[str],
    ) -> None:
        """Wire to a starting worker, and serve if a port was given (raises
        :class:`~sqla_jobs.ConfigurationError` if the port is taken). ``kinds``: the (kind,
        queue) pairs it handles, whose counters start at 0 rather than at their first run."""
        self._health = health
        self.running.set_function(running)
        self.queues.own_queues = tuple(queues)
        for kind, queue in kinds:
            self.runs.of(kind, queue)
        if self.port is not None and self._server is None:
            from sqla_jobs.observe.metrics_http import MetricsServer

            self._server = MetricsServer(self.registry, self._check, self.host, self.port)
            host, port = self._server.address
            shown = f"[{host}]" if ":" in host else host
            log.info(
                "serving metrics on http://%s:%d/metrics (and /healthz)",
                shown,
                port,
                extra={"event": "metrics_serving", "port": port},
            )

    def _check(self) -> tuple[bool, str]:
        return self._health()

    def _detach(self) -> None:
        """The worker has stopped: stop serving."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.queues.sampled(None)


__all__ = ["DURATION_BUCKETS", "OUTCOMES", "PICKUP_BUCKETS", "Metrics"]
