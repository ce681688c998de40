"""Poison job: a job whose handler kills its worker process on every run goes dead after its crash
budget, while a supervisor restarts the workers it kills and the healthy jobs enqueued with it
run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.reliability.chaos_app import (
    Fleet,
    Poison,
    Work,
    jobs,
    reset_tables,
    runs_by_job,
    scalar,
)
from tests.reliability.conftest import Figures, injects, scaled

WORKERS = 2
HEALTHY = scaled(200, 1000)
#: Short leases, so each crash is reaped (and the poison job re-claimed) within seconds.
OPTIONS = ("--lease", "2", "--heartbeat", "0.5", "--poll-interval", "0.2")
SETTLED = "SELECT count(*) = 0 FROM sqla_jobs_job WHERE state <> 'dead'"
DEADLINE = 90.0


def supervise(fleet: Fleet, engine: Engine, deadline: float = DEADLINE) -> int:
    """Restart every worker that dies until only dead jobs are left; the number of restarts."""
    replaced: set[int] = set()
    stop_at = time.monotonic() + deadline
    while not scalar(engine, SETTLED):
        assert time.monotonic() < stop_at, f"jobs left after {deadline:g}s:\n{fleet.logs()}"
        for w in list(fleet.workers):
            if w.proc.poll() is not None and w.pid not in replaced:
                replaced.add(w.pid)
                fleet.spawn()
        time.sleep(0.05)
    return len(replaced)


def rows(engine: Engine) -> dict[int, dict[str, Any]]:
    """What is left in the queue (dead jobs), by id."""
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id, state, attempts, crashes, last_error FROM sqla_jobs_job")
        ).all()
    return {int(r.id): dict(r._mapping) for r in found}


def crash_only(row: dict[str, Any]) -> bool:
    """Dead from crashes alone: every claim ended in an expired lease, none in a failure."""
    return (
        row["state"] == "dead"
        and row["attempts"] == row["crashes"] == 3
        and str(row["last_error"]).startswith("lease expired: worker ")
    )


@injects(
    f"a handler that calls os._exit(1) on every run, among {HEALTHY} healthy jobs; "
    f"{WORKERS} workers, each restarted by a supervisor when it dies"
)
def test_a_poison_job_goes_dead_after_three_crashes_and_the_fleet_keeps_working(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Poison job that kills its worker on every run: dead after 3 crashes, fleet keeps working"""
    reset_tables(clean)
    with Session(clean) as session:
        [poison_id] = jobs.enqueue_many(session, [Poison()])
        healthy = jobs.enqueue_many(session, [Work(ms=10) for _ in range(HEALTHY)])
        session.commit()
    fleet = Fleet(migrated_url, tmp_path, ("--concurrency", "2", *OPTIONS))
    started = time.monotonic()
    try:
        for _ in range(WORKERS):
            fleet.spawn()
        restarts = supervise(fleet, clean)
        elapsed = time.monotonic() - started
        survivors = fleet.alive()
        codes = fleet.stop()
    finally:
        fleet.close()
    assert len(survivors) == WORKERS
    assert set(codes.values()) == {0}, codes

    left = rows(clean)
    poison = left.pop(poison_id)
    assert crash_only(poison), poison
    runs = runs_by_job(clean)
    assert runs[poison_id] == 3, "the poison job ran more (or less) often than its crash budget"
    assert restarts == 3, "each run of the poison job, and only those, killed a worker"
    # The healthy jobs the poison job's process held share its crashes: today some share its fate
    # too (test_a_healthy_job_claimed_with_a_poison_job_is_not_dead_lettered_with_it); they must
    # at least be dead from crashes alone, never lost or failed.
    assert all(crash_only(row) for row in left.values()), left
    completed = [i for i in healthy if i not in left]
    assert all(runs[i] >= 1 for i in completed), "a healthy job completed without running"
    figures.record(
        workers=WORKERS,
        healthy_jobs=len(healthy),
        worker_deaths=restarts,
        poison_attempts=poison["attempts"],
        poison_crashes=poison["crashes"],
        healthy_completed=len(completed),
        healthy_dead_with_the_poison=len(left),
        healthy_lost=0,
        seconds=round(elapsed, 1),
    )


def test_a_healthy_job_claimed_with_a_poison_job_is_not_dead_lettered_with_it(
    clean: Engine, migrated_url: str, tmp_path: Path
) -> None:
    reset_tables(clean)
    with Session(clean) as session:
        [poison_id, healthy_id] = jobs.enqueue_many(session, [Poison(), Work(ms=50)])
        session.commit()
    # One worker with two slots: one claim takes both jobs, one process runs them.
    fleet = Fleet(migrated_url, tmp_path, ("--concurrency", "2", *OPTIONS))
    try:
        fleet.spawn()
        supervise(fleet, clean)
    finally:
        fleet.close()
    left = rows(clean)
    assert crash_only(left[poison_id])
    assert healthy_id not in left, f"dead-lettered with the poison job: {left[healthy_id]}"
    assert runs_by_job(clean)[healthy_id] >= 1
