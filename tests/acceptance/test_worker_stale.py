"""A worker process killed with SIGKILL is shown stale by ``sqla-jobs workers`` once it missed two
heartbeats, long before its jobs' leases end, and its running job is marked as such in ``jobs
list``, ``jobs show`` and the dashboard's Running page until the reaper takes it back."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from sqla_jobs.dashboard import create_app
from tests._waiting import wait_until
from tests.acceptance._processes import DEADLINE, WorkerProcess, run_cli
from tests.acceptance.app import Work, jobs
from tests.acceptance.test_worker_process import effects_of, enqueue

Spawn = Callable[..., WorkerProcess]
BEAT = 1.0
#: A lease far longer than the beats: "stale" must come from the missed beats, not the lease.
LEASE = 60.0
#: Stale two and a half beats after the last one, plus this for a loaded machine to see it (each
#: ``sqla-jobs workers`` call is a new Python process, seconds on a busy CI host).
MARGIN = 10.0


def lease_of(engine: Engine, job_id: int) -> tuple[str, float]:
    """The job's state and the seconds left of its lease, on the database clock."""
    with engine.connect() as conn:
        state, left = conn.execute(
            text(
                "SELECT state, extract(epoch FROM lease_expires_at - now())"
                " FROM sqla_jobs_job WHERE id = :id"
            ),
            {"id": job_id},
        ).one()
    return str(state), float(left)


def workers(url: str) -> list[dict[str, Any]]:
    result = run_cli("workers", "--json", database_url=url)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_sigkilled_worker_is_shown_stale_after_two_missed_beats_and_its_job_is_marked(
    effects: Engine, migrated_url: str, spawn_worker: Spawn
) -> None:
    with effects.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_worker"))
    (job_id,) = enqueue(effects, Work(tag="stale", first_run_seconds=120))
    worker = spawn_worker("--lease", str(LEASE), "--heartbeat", str(BEAT), "--poll-interval", "0.2")
    wait_until(lambda: effects_of(effects, job_id), "the handler is running")
    (row,) = workers(migrated_url)
    assert row["pid"] == worker.proc.pid
    assert not row["stale"]

    worker.proc.kill()
    killed = time.monotonic()
    assert worker.proc.wait(DEADLINE) == -signal.SIGKILL
    (row,) = wait_until(
        lambda: [w for w in workers(migrated_url) if w["stale"]],
        "sqla-jobs workers shows the killed worker stale",
        timeout=2.5 * BEAT + MARGIN,
    )
    seen = time.monotonic() - killed
    # Read at once, on the database clock: the lease the killed worker last renewed still holds,
    # so the stale mark came from the missed beats. Wall-clock spans would depend on the host.
    state, left = lease_of(effects, job_id)
    assert state == "running"
    assert left > 0, f"stale {seen:.1f}s after the kill, the lease already ended"
    assert row["pid"] == worker.proc.pid
    table = run_cli("workers", database_url=migrated_url).stdout
    assert "(stale)" in table, table

    listed = run_cli("jobs", "list", "--state", "running", database_url=migrated_url).stdout
    assert "running on a stale worker" in listed, listed
    assert "the reaper retakes it when its lease ends" in listed
    (line,) = run_cli(
        "jobs", "list", "--state", "running", "--json", database_url=migrated_url
    ).stdout.splitlines()
    marked = json.loads(line)["stale_worker"]
    assert marked["worker"] == row["name"]
    assert marked["heartbeat_age_seconds"] >= 2 * BEAT
    shown = run_cli("jobs", "show", str(job_id), database_url=migrated_url).stdout
    assert f"running on a stale worker ({row['name']}" in shown, shown

    with TestClient(create_app(effects, jobs=jobs)) as client:
        page = client.get("/jobs", params={"state": "running"})
    with effects.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_worker"))
    assert page.status_code == 200
    assert "running on a stale worker" in page.text, page.text
