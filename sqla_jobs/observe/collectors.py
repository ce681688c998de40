"""The collectors of :class:`sqla_jobs.metrics.Metrics`: what a worker counts, turned into
Prometheus metric families at each scrape. Imported only with the metrics.

A run's counts are kept by the worker's event loop in plain lists, one per (kind, queue), and read
by the scrape thread (a list or dict copied in one C call is consistent enough under the GIL): no
lock per job. prometheus_client's Counter and Histograms, each of which takes a lock, cost about
four microseconds per job here; these cost about one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from sqla_jobs.observe.sampler import Sample

#: The outcomes counted: a run's (as ``on_outcome`` hooks hear them) and ``crashed`` (a job the
#: reaper found under an expired lease).
OUTCOMES = ("completed", "failed", "dead", "cancelled", "snoozed", "crashed")
#: The states whose counts the sampler reports per queue (besides the due pending jobs).
SAMPLED_STATES = ("running", "dead", "cancelled", "completed")
#: The other per-queue rows of a sample: 1 for a paused queue, and the jobs not yet due.
_FLAGS = ("paused", "scheduled", "rate_limited")
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
PICKUP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)
#: The outcomes a run ends with, and their places in :attr:`Runs.outcomes`.
RUN_OUTCOMES = OUTCOMES[:-1]
OUTCOME_AT = {name: i for i, name in enumerate(RUN_OUTCOMES)}
_INF = float("inf")


class Runs:
    """The counts of one (kind, queue): by outcome, and the two histograms' buckets (the last
    one past the highest bound) and sums. Written only by the worker's loop: no lock per job."""

    __slots__ = ("duration_sum", "durations", "outcomes", "pickup_sum", "pickups")

    def __init__(self) -> None:
        self.outcomes = [0] * len(RUN_OUTCOMES)
        self.durations = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.pickups = [0] * (len(PICKUP_BUCKETS) + 1)
        self.pickup_sum = 0.0


class RunCollector(Collector):
    """``sqla_jobs_job_outcomes_total`` and the two histograms, built at each scrape from
    counts the worker's loop keeps in plain lists: about a microsecond per job, where
    prometheus_client's locked Counter and Histograms cost four."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], Runs] = {}
        #: Crashes by (kind, queue), written by the reaper's thread alone.
        self.crashes: dict[tuple[str, str], int] = {}
        #: Runs that completed after a cancel request, by (kind, queue); the loop writes them.
        self.cancels_ignored: dict[tuple[str, str], int] = {}

    def of(self, kind: str, queue: str) -> Runs:
        """The counts of ``kind`` in ``queue`` (made on first use)."""
        runs = self._runs.get((kind, queue))
        if runs is None:
            runs = self._runs[(kind, queue)] = Runs()
        return runs

    def describe(self) -> list[Metric]:
        return list(self._families({}, {}, {}))

    def collect(self) -> Iterator[Metric]:
        # One C-level copy each: the loop and the reaper may add a key meanwhile.
        yield from self._families(dict(self._runs), dict(self.crashes), dict(self.cancels_ignored))

    def _families(
        self,
        runs: dict[tuple[str, str], Runs],
        crashes: dict[tuple[str, str], int],
        ignored: dict[tuple[str, str], int],
    ) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "sqla_jobs_job_outcomes",
            "Runs of jobs by how they ended (crashed: found by this worker's reaper under an "
            "expired lease)",
            labels=("kind", "queue", "outcome"),
        )
        durations = HistogramMetricFamily(
            "sqla_jobs_job_duration_seconds", "How long handlers ran", labels=("kind", "queue")
        )
        pickups = HistogramMetricFamily(
            "sqla_jobs_job_pickup_delay_seconds",
            "From a job's run_at (by the database's clock) to its handler's start",
            labels=("kind", "queue"),
        )
        cancels_ignored = CounterMetricFamily(
            "sqla_jobs_job_cancels_ignored",
            "Runs an operator asked to cancel whose handlers returned anyway: they completed "
            "(sync handlers that do not check ctx.cancelled)",
            labels=("kind", "queue"),
        )
        for key in sorted(runs.keys() | crashes.keys()):
            cancels_ignored.add_metric(key, ignored.get(key, 0))
            run = runs.get(key) or Runs()
            for name, n in zip(RUN_OUTCOMES, run.outcomes, strict=True):
                outcomes.add_metric((*key, name), n)
            outcomes.add_metric((*key, "crashed"), crashes.get(key, 0))
            durations.add_metric(
                key, _cumulative(DURATION_BUCKETS, run.durations), run.duration_sum
            )
            pickups.add_metric(key, _cumulative(PICKUP_BUCKETS, run.pickups), run.pickup_sum)
        yield from (outcomes, durations, pickups, cancels_ignored)


def _cumulative(bounds: Sequence[float], counts: list[int]) -> list[tuple[str, float]]:
    counts = list(counts)  # one copy: the loop may count meanwhile
    out, total = [], 0
    for bound, n in zip((*bounds, _INF), counts, strict=True):
        total += n
        out.append(("+Inf" if bound == _INF else repr(float(bound)), float(total)))
    return out


class QueueCollector(Collector):
    """The queue-depth gauges, from the latest sample: only while this worker is the sampler,
    and only while that sample is younger than three intervals."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        #: The latest sample and when it was taken (one attribute: one store).
        self._sample: tuple[Sample | None, float] = (None, 0.0)
        #: The sampling worker's own queues: shown (at 0) even when they hold no job.
        self.own_queues: tuple[str, ...] = ()

    def sampled(self, sample: Sample | None) -> None:
        """A new sample (None: this worker is not the sampler now). From the sampler thread."""
        self._sample = (sample, time.monotonic())

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        sample, at = self._sample
        fresh = sample is not None and time.monotonic() - at < 3 * self._interval + 5
        yield from self._families(sample if fresh else None)

    def _families(self, sample: Sample | None = None) -> Iterator[Metric]:
        elected = GaugeMetricFamily(
            "sqla_jobs_sampler_elected",
            "1 on the one worker that samples the queues (the depth gauges are its alone)",
        )
        due = GaugeMetricFamily(
            "sqla_jobs_queue_due_jobs",
            "Pending jobs whose run_at has passed (sampled; jobs scheduled later not counted)",
            labels=("queue",),
        )
        oldest = GaugeMetricFamily(
            "sqla_jobs_queue_oldest_due_seconds",
            "Age of the oldest due pending job, by the database's clock (0: none due)",
            labels=("queue",),
        )
        depth = GaugeMetricFamily(
            "sqla_jobs_queue_jobs",
            "Jobs by state (running, dead, cancelled, completed), sampled",
            labels=("queue", "state"),
        )
        paused = GaugeMetricFamily(
            "sqla_jobs_queue_paused",
            "1 while an operator has the queue paused (workers claim none of its jobs), else 0",
            labels=("queue",),
        )
        scheduled = GaugeMetricFamily(
            "sqla_jobs_queue_scheduled_jobs",
            "Pending jobs not yet due, counted every 5 minutes: those without a concurrency key "
            "up to 10,000 per queue and priority (the cap bounds the count's cost), keyed ones all",
            labels=("queue",),
        )
        limited = GaugeMetricFamily(
            "sqla_jobs_queue_rate_limited_jobs",
            "Due pending jobs of kinds with a rate limit (held by their limit, or about to "
            "start), sampled; also counted in sqla_jobs_queue_due_jobs",
            labels=("queue",),
        )
        waiting = GaugeMetricFamily(
            "sqla_jobs_waiting_jobs_estimate",
            "Jobs waiting on their parents (job dependencies), all queues: the planner's estimate "
            "from the job table's statistics (the waiting share at its last ANALYZE, times its "
            "rows now), which costs one read of the catalog whatever the backlog",
        )
        lag = GaugeMetricFamily(
            "sqla_jobs_schedule_lag_seconds",
            "Seconds a periodic schedule's next tick is overdue, by the database's clock (0: on "
            "time; paused schedules not shown)",
            labels=("schedule",),
        )
        elected.add_metric((), 1.0 if sample is not None else 0.0)
        if sample is not None:
            _add_sample(
                sample.queues, self.own_queues, due, oldest, depth, paused, scheduled, limited
            )
            for name, seconds in sample.schedules:
                lag.add_metric((name,), seconds)
            if sample.waiting is not None:
                waiting.add_metric((), float(sample.waiting))
        yield from (elected, due, oldest, depth, paused, scheduled, limited, waiting, lag)


def _add_sample(
    rows: list[tuple[Any, ...]],
    own: Sequence[str],
    due: GaugeMetricFamily,
    oldest: GaugeMetricFamily,
    depth: GaugeMetricFamily,
    paused: GaugeMetricFamily,
    scheduled: GaugeMetricFamily,
    limited: GaugeMetricFamily,
) -> None:
    names = ("due", "oldest", *SAMPLED_STATES, *_FLAGS)
    queues: dict[str, dict[str, float]] = {q: dict.fromkeys(names, 0.0) for q in own}
    for queue, state, jobs, age in rows:
        entry = queues.setdefault(str(queue), dict.fromkeys(names, 0.0))
        entry[str(state)] += float(jobs or 0)
        if age is not None:
            entry["oldest"] = max(entry["oldest"], float(age))
    for queue, entry in sorted(queues.items()):
        due.add_metric((queue,), entry["due"])
        oldest.add_metric((queue,), entry["oldest"])
        paused.add_metric((queue,), entry["paused"])
        scheduled.add_metric((queue,), entry["scheduled"])
        limited.add_metric((queue,), entry["rate_limited"])
        for state in SAMPLED_STATES:
            depth.add_metric((queue, state), entry[state])
