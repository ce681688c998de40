"""Kill -9: worker processes SIGKILLed at random while they work lose no job, and only the jobs a
killed worker held run again."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.reliability.chaos_app import (
    Fleet,
    Work,
    jobs,
    queue_length,
    reset_tables,
    runs_by_job,
)
from tests.reliability.conftest import Figures, injects, scaled

WORKERS = 3
JOBS = scaled(600, 3000)
#: Kills spread evenly over the run (after every JOBS / (KILLS + 1) completions), so the count does
#: not depend on how fast the machine drains the queue.
KILLS = scaled(5, 15)
#: Short leases, so a killed worker's jobs are rescued within about two seconds.
OPTIONS = ("--concurrency", "4", "--lease", "2", "--heartbeat", "0.5", "--poll-interval", "0.2")
DEADLINE = scaled(120, 400)


def held_by(engine: Engine, pid: int) -> set[int]:
    """The jobs whose lease the worker process ``pid`` holds (worker names are host:pid:random)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id FROM sqla_jobs_job WHERE state = 'running' AND locked_by LIKE :like"),
            {"like": f"%:{pid}:%"},
        )
        return {int(r[0]) for r in rows}


def crashes_per_run(engine: Engine, job_ids: set[int]) -> dict[int, list[int]]:
    """For each job, the ``crashes`` count each of its recorded runs saw, in run order."""
    out: dict[int, list[int]] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_id, crashes FROM chaos_effects WHERE job_id = any(:ids) ORDER BY seq"),
            {"ids": sorted(job_ids)},
        )
        for job_id, crashes in rows:
            out.setdefault(int(job_id), []).append(int(crashes))
    return out


@injects(
    f"SIGKILL of a random busy one of {WORKERS} worker processes, {KILLS} times evenly through "
    f"{JOBS} jobs of 10-40 ms; each restarted at once (lease 2 s)"
)
def test_sigkilled_workers_lose_no_job_and_rerun_only_the_jobs_they_held(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Kill -9 of random busy workers: every job done, none lost, re-runs only of jobs they held"""
    reset_tables(clean)
    rng = random.Random(20240611)
    with Session(clean) as session:
        ids = jobs.enqueue_many(session, [Work(ms=rng.randint(10, 40)) for _ in range(JOBS)])
        session.commit()
    fleet = Fleet(migrated_url, tmp_path, OPTIONS)
    kills = 0
    hits: Counter[int] = Counter()
    try:
        fleet.start_together(WORKERS, clean, jobs)
        started = time.monotonic()
        deadline = started + DEADLINE
        while (left := queue_length(clean)) > 0:
            assert time.monotonic() < deadline, f"jobs left after {DEADLINE}s:\n{fleet.logs()}"
            due = kills < KILLS and JOBS - left >= (kills + 1) * JOBS // (KILLS + 1)
            busy = [w for w in fleet.alive() if held_by(clean, w.pid)] if due else []
            if busy:
                victim = rng.choice(busy)
                before = held_by(clean, victim.pid)
                victim.proc.kill()
                victim.proc.wait(10)
                # The dead worker's rows cannot change until its leases expire (>= 1.5 s from
                # now): read now, every job it held at the moment it died is listed.
                hits.update(before | held_by(clean, victim.pid))
                kills += 1
                fleet.spawn()
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        codes = fleet.stop()
    finally:
        fleet.close()

    assert kills == KILLS, f"the queue drained after {kills} of {KILLS} kills"
    assert set(codes.values()) == {0}, f"a surviving worker did not stop cleanly: {codes}"
    assert queue_length(clean) == 0
    runs = runs_by_job(clean)
    lost = [i for i in ids if runs[i] == 0]
    assert lost == [], f"{len(lost)} jobs completed without ever running"
    assert set(runs) <= set(ids)
    reran = {i: n for i, n in runs.items() if n > 1}
    unexplained = {i: n for i, n in reran.items() if n - 1 > hits[i]}
    assert unexplained == {}, "jobs ran more often than kills hit them (job: runs)"
    # A re-run is a rescue from a crash, never a handler failure: the k-th run saw >= k crashes.
    for job_id, seen in crashes_per_run(clean, set(reran)).items():
        assert all(c >= k for k, c in enumerate(seen)), (job_id, seen)
    figures.record(
        workers=WORKERS,
        jobs=JOBS,
        kills=kills,
        jobs_held_at_kill=len(hits),
        lost=len(lost),
        duplicated=len(reran),
        reruns=sum(n - 1 for n in reran.values()),
        seconds=round(elapsed, 1),
    )
