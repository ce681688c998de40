"""A worker's Prometheus metrics, scraped over HTTP from in-process workers on a real PostgreSQL:
the outcome counters by kind and queue, the histograms, the crashes its reaper finds, the queue
gauges of the one elected sampler, /healthz, the address it binds, the labels it never carries;
and the registry of live workers (``sqla_jobs_worker``)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from sqla_jobs import (
    Backoff,
    ConfigurationError,
    JobCancelledError,
    JobContext,
    Jobs,
    Snooze,
    Worker,
)
from sqla_jobs.observe.metrics import Metrics
from sqla_jobs.sql import metrics as metrics_sql
from sqla_jobs.worker import health as _health
from tests._waiting import DEADLINE, wait_until
from tests.integration._workers import running_workers

#: A payload field and an error message that must never reach a label.
SECRET = "s3cr3t-payload-7f1c"
ERROR = "boom-error-text-91ab"
#: Label names a metric may carry (``le``: a histogram bucket's bound).
LABELS = {"kind", "queue", "outcome", "state", "le"}


class Task(BaseModel):
    note: str = SECRET


class Failing(BaseModel):
    note: str = SECRET


class Poison(BaseModel):
    note: str = SECRET


class Sleepy(BaseModel):
    note: str = SECRET


class Stoppable(BaseModel):
    note: str = SECRET


class Blocking(BaseModel):
    seconds: float


#: Set by a test once it has seen the blocked loop: the blocking kind's handler holds the loop
#: until then (``seconds`` at most), however late a loaded machine lets the test look.
LOOP_UNBLOCKED = threading.Event()


def make_jobs() -> tuple[Jobs, threading.Event]:
    """Kinds that end each way: completed, failed (retried in 10 minutes), dead, snoozed,
    cancelled (when an operator cancels it), and one that blocks the event loop."""
    jobs = Jobs()
    release = threading.Event()

    @jobs.kind("task", Task, queue="m1")
    def task(args: Task, ctx: JobContext) -> None:
        pass

    @jobs.kind("failing", Failing, queue="m2", max_attempts=5, backoff=Backoff(base=600))
    def failing(args: Failing, ctx: JobContext) -> None:
        raise RuntimeError(ERROR)

    @jobs.kind("poison", Poison, queue="m2", max_attempts=1)
    def poison(args: Poison, ctx: JobContext) -> None:
        raise RuntimeError(ERROR)

    @jobs.kind("sleepy", Sleepy, queue="m1")
    def sleepy(args: Sleepy, ctx: JobContext) -> None:
        raise Snooze(3600)

    @jobs.kind("stoppable", Stoppable, queue="m1")
    def stoppable(args: Stoppable, ctx: JobContext) -> None:
        deadline = time.monotonic() + DEADLINE
        while not (ctx.cancelled.is_set() or release.is_set()):
            if time.monotonic() > deadline:
                raise RuntimeError("never cancelled")
            release.wait(0.02)
        raise JobCancelledError("stopped")

    @jobs.kind("blocking", Blocking, queue="m1")
    async def blocking(args: Blocking, ctx: JobContext) -> None:
        LOOP_UNBLOCKED.wait(args.seconds)  # blocks the event loop: what /healthz must notice

    return jobs, release


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(metrics: Metrics) -> Samples:
    """Every sample of the worker's /metrics, by name and labels."""
    assert metrics.address is not None, "the worker serves no metrics"
    host, port = metrics.address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        body = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def task_outcomes(metrics: Metrics, outcome: str) -> float | None:
    """How many runs of kind task in queue m1 ended ``outcome``, scraped now."""
    samples = scrape(metrics)
    return value(samples, "sqla_jobs_job_outcomes_total", kind="task", queue="m1", outcome=outcome)


def healthz(metrics: Metrics) -> tuple[int, str]:
    assert metrics.address is not None
    host, port = metrics.address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def enqueue(engine: Engine, jobs: Jobs, payloads: list[BaseModel], **options: Any) -> list[int]:
    with Session(engine) as session:
        ids = jobs.enqueue_many(session, payloads, **options)
        session.commit()
    return ids


def states(engine: Engine, ids: list[int]) -> list[str]:
    with engine.connect() as conn:
        found = dict(
            conn.execute(
                text("SELECT id, state FROM sqla_jobs_job WHERE id = ANY(:ids)"), {"ids": ids}
            ).all()
        )
    return [found.get(i, "gone") for i in ids]


@pytest.fixture
def quiet(clean: Engine) -> Engine:
    """The engine, with empty queue and schedule tables and no registered worker."""
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_worker, sqla_jobs_queue, sqla_jobs_schedule"))
    return clean


def fast(metrics: Metrics) -> dict[str, Any]:
    """Worker options for a test: quick polls and reaps, and ``metrics``."""
    return {
        "metrics": metrics,
        "concurrency": 8,
        "poll_interval": 0.1,
        "lease": 3.0,
        "reap_interval": 0.2,
        "queues": ["m1", "m2"],
    }


def test_counters_say_how_each_run_ended_by_kind_and_queue_and_histograms_count_the_runs(
    quiet: Engine, migrated_url: str
) -> None:
    jobs, _ = make_jobs()
    metrics = Metrics(port=0, sample_interval=0.2)
    n = 3
    with running_workers(jobs, migrated_url, **fast(metrics)):
        enqueue(quiet, jobs, [Task() for _ in range(n)])
        enqueue(quiet, jobs, [Task() for _ in range(n + 1)], queue="m2")
        enqueue(quiet, jobs, [Failing() for _ in range(n)])
        enqueue(quiet, jobs, [Poison() for _ in range(n)])
        enqueue(quiet, jobs, [Sleepy() for _ in range(n)])
        stoppable = enqueue(quiet, jobs, [Stoppable() for _ in range(n)])
        wait_until(lambda: states(quiet, stoppable) == ["running"] * n, what="stoppable running")
        # Claimed is not started: a job cancelled while it waits for a slot never runs, and has
        # no duration. Their pickups are counted when their handlers start.
        wait_until(
            lambda: (
                value(
                    scrape(metrics),
                    "sqla_jobs_job_pickup_delay_seconds_count",
                    kind="stoppable",
                    queue="m1",
                )
                == n
            ),
            what="the stoppable handlers started",
        )
        with Session(quiet) as session:
            assert len(jobs.cancel(session, stoppable).requested) == n
            session.commit()
        expected = {
            ("task", "m1", "completed"): n,
            ("task", "m2", "completed"): n + 1,
            ("failing", "m2", "failed"): n,
            ("poison", "m2", "dead"): n,
            ("sleepy", "m1", "snoozed"): n,
            ("stoppable", "m1", "cancelled"): n,
        }

        def counted() -> bool:
            samples = scrape(metrics)
            return all(
                value(samples, "sqla_jobs_job_outcomes_total", kind=k, queue=q, outcome=o) == c
                for (k, q, o), c in expected.items()
            )

        wait_until(counted, what=f"the outcome counters reach {expected}")
        samples = scrape(metrics)
    # Nothing else was counted: the other outcomes of each handled kind start (and stay) at 0.
    counted_outcomes = {
        (dict(labels)["kind"], dict(labels)["queue"], dict(labels)["outcome"]): v
        for (name, labels), v in samples.items()
        if name == "sqla_jobs_job_outcomes_total" and v
    }
    assert counted_outcomes == expected
    assert (
        value(samples, "sqla_jobs_job_outcomes_total", kind="task", queue="m1", outcome="dead") == 0
    )
    for (kind, queue, _), runs in expected.items():
        for histogram in ("sqla_jobs_job_duration_seconds", "sqla_jobs_job_pickup_delay_seconds"):
            assert value(samples, f"{histogram}_count", kind=kind, queue=queue) == runs
            assert value(samples, f"{histogram}_bucket", kind=kind, queue=queue, le="+Inf") == runs
    # The pickup delay is from run_at to the start: under the deadline, never negative.
    total = value(samples, "sqla_jobs_job_pickup_delay_seconds_sum", kind="task", queue="m1")
    assert total is not None
    assert 0 <= total < 10 * n
    # The stoppable handlers ran until they were cancelled: their durations are not zero.
    took = value(samples, "sqla_jobs_job_duration_seconds_sum", kind="stoppable", queue="m1")
    assert took is not None
    assert took > 0


def test_the_pickup_delay_counts_from_run_at_by_the_database_clock(
    quiet: Engine, migrated_url: str
) -> None:
    """A job due 30 s ago (by the database's clock) is picked up 30 s late, not 0."""
    jobs, _ = make_jobs()
    metrics = Metrics(port=0, sample_interval=0.2)
    (late,) = enqueue(quiet, jobs, [Task()], delay=3600)
    with quiet.begin() as conn:
        conn.execute(
            text("UPDATE sqla_jobs_job SET run_at = now() - interval '30 seconds' WHERE id = :id"),
            {"id": late},
        )
    with running_workers(jobs, migrated_url, **fast(metrics)):
        wait_until(lambda: states(quiet, [late]) == ["gone"], what="the late job ran")
        wait_until(
            lambda: (
                value(
                    scrape(metrics),
                    "sqla_jobs_job_pickup_delay_seconds_count",
                    kind="task",
                    queue="m1",
                )
                == 1
            ),
            what="its pickup is observed",
        )
        samples = scrape(metrics)
    delay = value(samples, "sqla_jobs_job_pickup_delay_seconds_sum", kind="task", queue="m1")
    assert delay is not None
    assert 30 <= delay < 45
    assert (
        value(
            samples, "sqla_jobs_job_pickup_delay_seconds_bucket", kind="task", queue="m1", le="10.0"
        )
        == 0
    )
    assert (
        value(
            samples, "sqla_jobs_job_pickup_delay_seconds_bucket", kind="task", queue="m1", le="60.0"
        )
        == 1
    )


def test_the_reaper_counts_a_crashed_job_by_kind_and_queue(
    quiet: Engine, migrated_url: str
) -> None:
    jobs, _ = make_jobs()
    metrics = Metrics(port=0, sample_interval=0.2)
    (crashed,) = enqueue(quiet, jobs, [Task()], delay=3600)
    with quiet.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'running', attempts = 1, "
                "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second', "
                "locked_by = 'vanished' WHERE id = :id"
            ),
            {"id": crashed},
        )
    with running_workers(jobs, migrated_url, **fast(metrics)):
        wait_until(
            lambda: task_outcomes(metrics, "crashed") == 1,
            what="the crash is counted",
        )
        wait_until(lambda: states(quiet, [crashed]) == ["gone"], what="the rescued job ran")
        wait_until(
            lambda: task_outcomes(metrics, "completed") == 1,
            what="its second run is counted",
        )


def test_one_elected_worker_shows_the_queue_gauges_and_another_takes_over_when_it_stops(
    quiet: Engine, migrated_url: str
) -> None:
    """Two workers: exactly one shows the depth gauges (due jobs, the oldest due age, jobs by
    state), which never count jobs scheduled for later; once it stops, the other shows them."""
    jobs, _ = make_jobs()
    enqueue(quiet, jobs, [Task() for _ in range(4)], queue="parked")
    enqueue(quiet, jobs, [Task() for _ in range(2)], queue="parked", delay=3600)
    (dead,) = enqueue(quiet, jobs, [Task()], queue="parked")
    with quiet.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET run_at = now() - interval '20 seconds' "
                "WHERE queue = 'parked' AND run_at <= now()"
            )
        )
        conn.execute(
            text("UPDATE sqla_jobs_job SET state = 'dead', finished_at = now() WHERE id = :id"),
            {"id": dead},
        )
        # A paused queue, and two schedules: one on time, one whose tick is 30 s overdue.
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_queue (queue, paused_at) VALUES ('parked', now()) "
                "ON CONFLICT (queue) DO UPDATE SET paused_at = now()"
            )
        )
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_schedule (name, kind, spec, next_tick_at) VALUES "
                "('late', 'task', 'every 60s', now() - interval '30 seconds'), "
                "('prompt', 'task', 'every 60s', now() + interval '30 seconds')"
            )
        )
    first, second = Metrics(port=0, sample_interval=0.1), Metrics(port=0, sample_interval=0.1)
    with (
        running_workers(jobs, migrated_url, **fast(first)) as [one],
        running_workers(jobs, migrated_url, **fast(second)) as [two],
    ):

        def elected() -> list[Metrics]:
            return [
                m for m in (first, second) if value(scrape(m), "sqla_jobs_sampler_elected") == 1
            ]

        (sampler,) = wait_until(elected, what="one worker is elected sampler")
        samples = wait_until(
            lambda: (
                (s := scrape(sampler))
                and value(s, "sqla_jobs_queue_due_jobs", queue="parked") == 4
                and s
            ),
            what="the sampler counts the due jobs",
        )
        assert value(samples, "sqla_jobs_queue_jobs", queue="parked", state="dead") == 1
        assert value(samples, "sqla_jobs_queue_jobs", queue="parked", state="running") == 0
        oldest = value(samples, "sqla_jobs_queue_oldest_due_seconds", queue="parked")
        assert oldest is not None
        assert 20 <= oldest < 40
        # The workers' own queues are shown at 0.
        assert value(samples, "sqla_jobs_queue_due_jobs", queue="m1") == 0
        # Paused or not, the jobs scheduled for later (counted apart), and the schedules' lag.
        assert value(samples, "sqla_jobs_queue_paused", queue="parked") == 1
        assert value(samples, "sqla_jobs_queue_paused", queue="m1") == 0
        assert value(samples, "sqla_jobs_queue_scheduled_jobs", queue="parked") == 2
        assert value(samples, "sqla_jobs_queue_scheduled_jobs", queue="m1") == 0
        late = value(samples, "sqla_jobs_schedule_lag_seconds", schedule="late")
        assert late is not None
        assert 30 <= late < 60
        assert value(samples, "sqla_jobs_schedule_lag_seconds", schedule="prompt") == 0
        other = second if sampler is first else first
        others = scrape(other)
        assert value(others, "sqla_jobs_sampler_elected") == 0
        assert not [k for k in others if k[0].startswith("sqla_jobs_queue_")]

        (one if sampler is first else two).stop()
        wait_until(lambda: sampler.address is None, what="the sampler's worker stopped")
        wait_until(
            lambda: value(scrape(other), "sqla_jobs_queue_due_jobs", queue="parked") == 4,
            what="the other worker takes over the sampling",
        )


def test_a_worker_told_not_to_sample_never_takes_the_sampler_role(
    quiet: Engine, migrated_url: str
) -> None:
    """``sample_interval=None`` (``--metrics-interval 0``): no sampler thread, no connection for
    it, no queue gauges; its runs are still counted."""
    jobs, _ = make_jobs()
    metrics = Metrics(port=0, sample_interval=None)
    with running_workers(jobs, migrated_url, **fast(metrics)) as [worker]:
        assert worker.monitor.sampler is None
        enqueue(quiet, jobs, [Task()])
        wait_until(
            lambda: task_outcomes(metrics, "completed") == 1,
            what="the run is counted",
        )
        samples = scrape(metrics)
    assert value(samples, "sqla_jobs_sampler_elected") == 0
    assert not [k for k in samples if k[0].startswith("sqla_jobs_queue_")]


def test_healthz_is_200_while_the_worker_runs_and_503_while_it_stops_or_its_loop_is_blocked(
    quiet: Engine, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_health, "STALL_SECONDS", 0.5)
    jobs, release = make_jobs()
    metrics = Metrics(port=0, sample_interval=0.2)
    with running_workers(jobs, migrated_url, **fast(metrics)) as [worker]:
        assert healthz(metrics) == (200, "ok")
        LOOP_UNBLOCKED.clear()

        def blocked_reply() -> tuple[int, str] | None:
            reply = healthz(metrics)
            return reply if reply[1].startswith("event loop blocked") else None

        try:
            enqueue(quiet, jobs, [Blocking(seconds=DEADLINE)])
            code, _ = wait_until(blocked_reply, what="/healthz sees the blocked loop")
        finally:
            LOOP_UNBLOCKED.set()
        assert code == 503
        wait_until(lambda: healthz(metrics) == (200, "ok"), what="healthy again")
        (held,) = enqueue(quiet, jobs, [Stoppable()])
        wait_until(lambda: states(quiet, [held]) == ["running"], what="a job runs")
        worker.stop()
        assert healthz(metrics) == (503, "stopping")  # while its handler still runs
        address = metrics.address
        release.set()
        wait_until(lambda: metrics.address is None, what="the worker stopped")
    assert address is not None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=2).close()


def test_metrics_bind_127_0_0_1_unless_told_otherwise(quiet: Engine, migrated_url: str) -> None:
    jobs, _ = make_jobs()
    metrics = Metrics(port=0)
    with running_workers(jobs, migrated_url, **fast(metrics)):
        assert metrics.address is not None
        assert metrics.address[0] == "127.0.0.1"


def test_a_taken_metrics_port_stops_the_worker_before_it_connects(migrated_url: str) -> None:
    jobs, _ = make_jobs()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = Worker(jobs, migrated_url, metrics=Metrics(port=port), queues=["m1"])
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            worker.run_sync(install_signal_handlers=False)
    assert worker.lanes is None or all(lane.conn is None for lane in worker.lanes.lanes)


def test_labels_carry_kinds_queues_outcomes_and_states_never_ids_payloads_or_errors(
    quiet: Engine, migrated_url: str
) -> None:
    jobs, _ = make_jobs()
    metrics = Metrics(port=0, sample_interval=0.1)
    with running_workers(jobs, migrated_url, **fast(metrics)):
        ids = enqueue(quiet, jobs, [Task(), Poison(), Failing(), Sleepy()])
        wait_until(
            lambda: (
                sum(
                    v
                    for (n, _), v in scrape(metrics).items()
                    if n == "sqla_jobs_job_outcomes_total"
                )
                == 4
            ),
            what="every run counted",
        )
        wait_until(
            lambda: value(scrape(metrics), "sqla_jobs_queue_jobs", queue="m2", state="dead") == 1,
            what="a sample with the dead job",
        )
        samples = scrape(metrics)
    names = {label for _, labels in samples for label, _ in labels}
    assert names <= LABELS
    values = {v for _, labels in samples for k, v in labels if k != "le"}
    assert values <= {
        "task", "failing", "poison", "sleepy", "stoppable", "blocking",
        "m1", "m2",
        "completed", "failed", "dead", "cancelled", "snoozed", "crashed", "running",
    }  # fmt: skip
    assert not values & {str(i) for i in ids}
    assert not any(SECRET in v or ERROR in v for v in values)


def test_metrics_go_into_the_applications_registry_when_given_one(
    quiet: Engine, migrated_url: str
) -> None:
    registry = CollectorRegistry()
    jobs, _ = make_jobs()
    metrics = Metrics(registry, sample_interval=0.1)
    with running_workers(jobs, migrated_url, **fast(metrics)):
        assert metrics.address is None  # no port: the application serves its registry itself
        enqueue(quiet, jobs, [Task()])
        wait_until(
            lambda: (
                b'sqla_jobs_job_outcomes_total{kind="task",outcome="completed",queue="m1"} 1.0'
                in generate_latest(registry)
            ),
            what="the completion is in the application's registry",
        )
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Metrics(registry)


# -- the registry of live workers ----------------------------------------------------------------


def registered(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r.name: r for r in conn.execute(text("SELECT * FROM sqla_jobs_worker"))}


def test_a_worker_registers_at_start_heartbeats_and_leaves_at_stop(
    quiet: Engine, migrated_url: str
) -> None:
    jobs, _ = make_jobs()
    with running_workers(jobs, migrated_url, queues=["m1", "m2"], concurrency=3, heartbeat=0.2) as [
        worker
    ]:
        row = registered(quiet)[worker.name]  # written before `started` is set
        assert (row.host, row.pid, row.queues, row.concurrency) == (
            socket.gethostname(),
            os.getpid(),
            ["m1", "m2"],
            3,
        )
        assert row.started_at <= row.heartbeat_at < row.expires_at
        wait_until(
            lambda: registered(quiet)[worker.name].heartbeat_at > row.heartbeat_at,
            what="the heartbeat moves forward",
        )
        assert registered(quiet)[worker.name].started_at == row.started_at
    assert worker.name not in registered(quiet)


def test_a_stale_registry_row_is_pruned_by_another_workers_reaper_a_lease_later_once_its_jobs_are_gone(
    quiet: Engine, migrated_url: str
) -> None:
    """A worker killed without stopping leaves its row; it shows stale once its expires_at passes
    (by the database's clock), and any worker's reaper deletes it a lease later (the reaper's
    own), unless a job it held still runs: the row stays, marked stale, until the job is reaped.
    (A real SIGKILL: tests/acceptance.)"""
    with quiet.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_worker (name, host, pid, queues, concurrency, expires_at) "
                "VALUES ('killed', 'h', 1, '{m1}', 4, now() - interval '1 minute'), "
                "('holding', 'h', 3, '{m1}', 4, now() - interval '1 minute'), "
                "('recent', 'h', 4, '{m1}', 4, now() - interval '1 second'), "
                "('alive', 'h', 2, '{m1}', 4, now() + interval '1 hour')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload, state, attempts, locked_by, "
                "lease_token, lease_expires_at) VALUES ('elsewhere', 'k', '{}', 'running', 1, "
                "'holding', gen_random_uuid(), now() + interval '1 hour')"
            )
        )
    jobs, _ = make_jobs()
    with running_workers(jobs, migrated_url, queues=["m1"], lease=30, reap_interval=0.2) as [
        worker
    ]:
        wait_until(lambda: "killed" not in registered(quiet), what="the stale row is pruned")
        assert {"alive", "holding", "recent", worker.name} <= set(registered(quiet))


def test_a_worker_without_the_registry_table_works_and_says_so(
    quiet: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database not yet migrated to sqla_jobs_0006 (or a role without the grants): the worker
    logs it once and runs its jobs."""
    jobs, _ = make_jobs()
    with quiet.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_jobs_worker RENAME TO sqla_jobs_worker_away"))
    try:
        with running_workers(jobs, migrated_url, queues=["m1"], reap_interval=0.2):
            (done,) = enqueue(quiet, jobs, [Task()])
            wait_until(lambda: states(quiet, [done]) == ["gone"], what="the job ran")
    finally:
        with quiet.begin() as conn:
            conn.execute(text("ALTER TABLE sqla_jobs_worker_away RENAME TO sqla_jobs_worker"))
    refused = [r for r in caplog.records if getattr(r, "event", None) == "registry_refused"]
    assert len(refused) == 1
    assert "sqla_jobs_0006" in refused[0].getMessage()


def test_the_queue_sample_reads_no_job_scheduled_for_later(quiet: Engine) -> None:
    """With 20,000 jobs scheduled for later and 30 due, the sample's unkeyed branch reads the
    claim index's due entries and one probe per (queue, priority): a few dozen rows, not 20,000
    (EXPLAIN ANALYZE's actual rows of every scan of the job table's claim index)."""
    with quiet.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at) "
                "SELECT 'q' || (i % 3), 'k', '{}', i % 2, now() + interval '1 hour' "
                "FROM generate_series(1, 20000) i"
            )
        )
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at) "
                "SELECT 'q' || (i % 3), 'k', '{}', i % 2, now() - interval '1 minute' "
                "FROM generate_series(1, 30) i"
            )
        )
    with quiet.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE sqla_jobs_job"))
        sql = str(
            metrics_sql.sample_queues().compile(
                dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
            )
        )
        rows = conn.execute(text(sql)).all()
        (plan,) = conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")).scalar_one()
    assert sorted((q, n) for q, state, n, _ in rows if state == "due") == [
        ("q0", 10),
        ("q1", 10),
        ("q2", 10),
    ]

    def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = [node] if node.get("Index Name") == "sqla_jobs_job_claim_idx" else []
        for child in node.get("Plans", []):
            found += scans(child)
        return found

    claim_scans = scans(plan["Plan"])
    assert claim_scans, json.dumps(plan)[:2000]
    read = sum(s["Actual Rows"] * s["Actual Loops"] for s in claim_scans)
    assert read < 200, json.dumps(plan)[:4000]


def test_metrics_and_a_middleware_that_reads_meta_share_one_claim(
    quiet: Engine, migrated_url: str
) -> None:
    """With metrics and a middleware that reads ``ctx.meta``, the claim returns both the meta and
    when the job became due (the last column): each is read right."""
    jobs, _ = make_jobs()
    seen: list[dict[str, Any]] = []

    async def read_meta(ctx: JobContext, call_next: Any) -> None:
        seen.append(ctx.meta)
        await call_next()

    jobs.hooks.middleware(read_meta, meta=True)
    metrics = Metrics(port=0, sample_interval=0.2)
    (late,) = enqueue(quiet, jobs, [Task()], delay=3600, meta={"trace": "t-1"})
    with quiet.begin() as conn:
        conn.execute(
            text("UPDATE sqla_jobs_job SET run_at = now() - interval '30 seconds' WHERE id = :id"),
            {"id": late},
        )
    with running_workers(jobs, migrated_url, **fast(metrics)) as [worker]:
        assert worker._sql.meta
        assert worker._sql.timed
        wait_until(lambda: states(quiet, [late]) == ["gone"], what="the job ran")
        samples = wait_until(
            lambda: (
                (s := scrape(metrics))
                and value(s, "sqla_jobs_job_pickup_delay_seconds_count", kind="task", queue="m1")
                == 1
                and s
            ),
            what="its pickup is observed",
        )
    assert seen == [{"trace": "t-1"}]
    delay = value(samples, "sqla_jobs_job_pickup_delay_seconds_sum", kind="task", queue="m1")
    assert delay is not None
    assert 30 <= delay < 45
