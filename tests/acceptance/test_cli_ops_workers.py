"""The operations commands against a worker running in another process. The worker polls every 30
seconds, so anything it does within a couple of seconds of a command was caused by the command's
NOTIFY (or, for a pause, by the claim reading the paused queue)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import wait_until
from tests.acceptance._processes import WorkerProcess, run_cli
from tests.acceptance.app import EFFECTS_TABLE
from tests.acceptance.ops_app import jobs

Spawn = Callable[..., WorkerProcess]
TARGET = "tests.acceptance.ops_app:jobs"
#: A poll interval no test waits for: only a NOTIFY explains what happens before it.
SLOW_POLL = ("--poll-interval", "30", "--queues", "ops,witness")
#: How long a worker may take to act on a command once it has run: a third of the poll, so only
#: the command's NOTIFY explains it, with room for a loaded host's scheduling.
PROMPT = 10.0


def enqueue(engine: Engine, kind: str, tag: str, queue: str | None = None) -> int:
    with Session(engine) as session:
        job_id = jobs.enqueue(session, kind, {"tag": tag}, queue=queue).id
        session.commit()
    return job_id


def state_of(engine: Engine, job_id: int) -> str | None:
    with engine.connect() as conn:
        found: Any = conn.execute(
            text("SELECT state FROM sqla_jobs_job WHERE id = :id"), {"id": job_id}
        ).scalar()
    return None if found is None else str(found)


def events(engine: Engine, job_id: int) -> list[str]:
    with engine.connect() as conn:
        return [
            r[0]
            for r in conn.execute(
                text(f"SELECT event FROM {EFFECTS_TABLE} WHERE job_id = :id ORDER BY seq"),
                {"id": job_id},
            )
        ]


def test_jobs_cancel_stops_a_running_sync_and_a_running_async_job_within_seconds(
    ops_effects: Engine, migrated_url: str, spawn_worker: Spawn
) -> None:
    sync_id = enqueue(ops_effects, "spin", "sync")
    async_id = enqueue(ops_effects, "hang", "async")
    spawn_worker(*SLOW_POLL, target=TARGET)
    for job_id in (sync_id, async_id):
        wait_until(lambda j=job_id: "started" in events(ops_effects, j), f"job {job_id} runs")

    result = run_cli("jobs", "cancel", str(sync_id), str(async_id), database_url=migrated_url)
    asked = time.monotonic()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"asked the workers to stop 2 running jobs: {sync_id}, ")
    for job_id in (sync_id, async_id):
        wait_until(
            lambda j=job_id: state_of(ops_effects, j) == "cancelled",
            f"job {job_id} ends cancelled",
            timeout=PROMPT,
        )
    assert time.monotonic() - asked < PROMPT
    assert events(ops_effects, sync_id) == ["started", "saw_cancel"]
    assert events(ops_effects, async_id) == ["started"], "the async handler was cancelled"


def test_a_paused_queue_is_not_claimed_by_a_running_worker_until_it_is_resumed(
    ops_effects: Engine, migrated_url: str, spawn_worker: Spawn
) -> None:
    worker = spawn_worker(*SLOW_POLL, target=TARGET)
    worker.wait_logged("started")
    paused = run_cli("queues", "pause", "ops", database_url=migrated_url)
    assert paused.returncode == 0, paused.stderr

    held = enqueue(ops_effects, "note", "held")
    # The witness is enqueued after the held job: once it ran, the worker's claim saw both.
    witness = enqueue(ops_effects, "note", "witness", queue="witness")
    wait_until(lambda: state_of(ops_effects, witness) is None, "the witness runs", timeout=PROMPT)
    assert state_of(ops_effects, held) == "pending"
    assert events(ops_effects, held) == []

    resumed = run_cli("queues", "resume", "ops", database_url=migrated_url)
    assert resumed.returncode == 0, resumed.stderr
    wait_until(
        lambda: events(ops_effects, held) == ["finished"],
        "the held job runs once its queue is resumed",
        timeout=PROMPT,
    )


def test_jobs_retry_of_a_dead_job_runs_it_again_on_the_worker_and_it_succeeds(
    ops_effects: Engine, migrated_url: str, spawn_worker: Spawn
) -> None:
    job_id = enqueue(ops_effects, "fragile", "retried")
    spawn_worker(*SLOW_POLL, target=TARGET)
    wait_until(lambda: state_of(ops_effects, job_id) == "dead", "the job goes dead")
    shown = run_cli("jobs", "show", str(job_id), database_url=migrated_url)
    assert "RuntimeError: first run fails" in shown.stdout

    result = run_cli("jobs", "retry", str(job_id), database_url=migrated_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"retried 1 job: {job_id}\n"
    wait_until(
        lambda: state_of(ops_effects, job_id) is None, "the retried job completes", timeout=PROMPT
    )
    assert events(ops_effects, job_id) == ["failed", "finished"]
