"""``sqla-jobs worker --metrics-port``: a real worker process serves its metrics and /healthz over
HTTP on 127.0.0.1; a killed worker's row in the registry of live workers is pruned by the next
worker's reaper, and ``sqla-jobs workers`` lists the live ones."""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.acceptance._processes import WorkerProcess, run_cli, wait_until
from tests.acceptance.app import Work, jobs

Spawn = Callable[..., WorkerProcess]
#: Short leases (a reap every second, a registry row stale 3 s after its last beat), quick polls.
QUICK = ("--lease", "2", "--heartbeat", "0.5", "--poll-interval", "0.2")


def serving_port(worker: WorkerProcess) -> int:
    """The port the worker logged it serves its metrics on."""
    worker.wait_logged("metrics_serving")
    found = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", worker.log)
    assert found, worker.log
    return int(found[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(body: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def registered_pids(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.scalars(text("SELECT pid FROM sqla_jobs_worker")))


def test_a_worker_process_serves_metrics_and_healthz_on_127_0_0_1(
    effects: Engine, spawn_worker: Spawn
) -> None:
    with effects.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_worker"))
    worker = spawn_worker(*QUICK, "--metrics-port", "0", "--metrics-interval", "0.2")
    port = serving_port(worker)
    worker.wait_logged("started")
    assert get(port, "/healthz") == (200, "ok\n")
    with Session(effects) as session:
        jobs.enqueue_many(session, [Work(tag=f"m{i}") for i in range(3)])
        jobs.enqueue(session, Work(tag="later"), delay=3600)
        session.commit()

    def scraped() -> str | None:
        status, body = get(port, "/metrics")
        assert status == 200
        done = sample(
            body, "sqla_jobs_job_outcomes_total", kind="work", queue="default", outcome="completed"
        )
        return body if done == 3 else None

    body = wait_until(scraped, "three completions are counted")
    assert sample(body, "sqla_jobs_job_duration_seconds_count", kind="work", queue="default") == 3
    assert (
        sample(body, "sqla_jobs_job_pickup_delay_seconds_count", kind="work", queue="default") == 3
    )

    def sampled() -> str | None:
        # A sample taken after the three completions were written: one taken while they ran
        # counted them running (the gauges are as of the last sample).
        body = get(port, "/metrics")[1]
        due = sample(body, "sqla_jobs_queue_due_jobs", queue="default")
        running = sample(body, "sqla_jobs_queue_jobs", queue="default", state="running")
        return body if (due, running) == (0, 0) else None

    body = wait_until(sampled, "a sample of the queue")
    assert sample(body, "sqla_jobs_sampler_elected") == 1
    assert get(port, "/nothing-here")[0] == 404

    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(15) == 0, worker.log
    assert worker.proc.pid not in registered_pids(effects)


def test_a_killed_workers_row_is_pruned_by_the_next_worker_and_workers_lists_the_live_one(
    effects: Engine, spawn_worker: Spawn, migrated_url: str
) -> None:
    with effects.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_worker"))
    killed = spawn_worker(*QUICK)
    killed.wait_logged("started")
    assert killed.proc.pid in registered_pids(effects)
    killed.proc.kill()
    killed.proc.wait(10)
    assert killed.proc.pid in registered_pids(effects)  # nobody deleted it: it was killed

    live = spawn_worker(*QUICK)
    live.wait_logged("started")
    wait_until(
        lambda: registered_pids(effects) == {live.proc.pid},
        "the killed worker's row is pruned once it expires, the live one's kept",
    )
    listed = run_cli("workers", "--json", database_url=migrated_url)
    assert listed.returncode == 0, listed.stderr
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["pid"] == live.proc.pid
    assert row["queues"] == ["default"]
    assert row["stale"] is False
    table = run_cli("workers", database_url=migrated_url)
    assert table.returncode == 0, table.stderr
    assert f" {live.proc.pid} " in table.stdout

    live.proc.send_signal(signal.SIGTERM)
    assert live.proc.wait(15) == 0, live.log
    assert registered_pids(effects) == set()
    assert run_cli("workers", database_url=migrated_url).stdout.strip() == "(no workers)"
