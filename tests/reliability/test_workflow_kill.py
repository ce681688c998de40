"""Kill -9 in the middle of workflows: worker processes SIGKILLed while graphs of dependent jobs
run (three roots -> one fan-in -> one tail, per graph; in one graph of four the fan-in also waits
on a root that always fails) leave every job run exactly once in effect, no child started before
all its parents' effects committed, none lost or left waiting, and the dependents of the dead
roots cancelled.

The handlers take the worker's Session (tests/reliability/workflow_app.py): a run's record commits
with its job's completion, which releases its children in the same transaction, so a kill between
the record and the completion rolls back both, and the job runs again on another worker.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.reliability.chaos_app import Fleet
from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.workflow_app import RUNS_DDL, TARGET, Doomed, Step, jobs

WORKERS = 3
GRAPHS = scaled(40, 200)
#: Seconds between two kills: the small run's 4 kills take 1.2 s, well inside its work (240
#: jobs of 50-150 ms on 12 slots, graphs three steps deep, plus the leases the kills expire).
KILL_EVERY = 0.3
KILLS = scaled(4, 12)
OPTIONS = (
    "--concurrency", "4", "--lease", "2", "--heartbeat", "0.5", "--poll-interval", "5",
)  # fmt: skip
DEADLINE = scaled(90, 600)
ROOTS = ("r1", "r2", "r3")


def enqueue_graphs(engine: Engine, rng: random.Random) -> tuple[dict[int, list[int]], set[int]]:
    """Enqueue every graph (one transaction each); each job's parents, by job id, and the jobs
    that must end cancelled (each graph's mid also waits on a doomed root in one graph of four,
    so that mid and the tail after it are cancelled)."""
    parents: dict[int, list[int]] = {}
    doomed: set[int] = set()
    for g in range(GRAPHS):
        with Session(engine) as session, session.begin():
            roots = [
                jobs.enqueue(session, Step(graph=g, node=n, ms=rng.randint(50, 150))) for n in ROOTS
            ]
            failing = [jobs.enqueue(session, Doomed(graph=g))] if g % 4 == 3 else []
            mid = jobs.enqueue(session, Step(graph=g, node="mid", ms=rng.randint(50, 150)),
                               depends_on=[*roots, *failing])  # fmt: skip
            tail = jobs.enqueue(session, Step(graph=g, node="tail", ms=rng.randint(50, 150)),
                                depends_on=[mid])  # fmt: skip
            session.flush()
            for r in roots:
                parents[r.id] = []
            parents[mid.id] = [r.id for r in roots]
            parents[tail.id] = [mid.id]
            if failing:
                doomed |= {mid.id, tail.id}
    return parents, doomed


def unfinished(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM sqla_jobs_job "
                    "WHERE state IN ('pending', 'running', 'waiting')"
                )
            ).scalar_one()
        )


def cancelled_by_parent(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id FROM sqla_jobs_job WHERE state = 'cancelled' "
                "AND errors -> -1 ->> 'error' = 'ParentFailed'"
            )
        )
        return {int(r[0]) for r in rows}


def runs(engine: Engine) -> list[tuple[int, object, object]]:
    with engine.connect() as conn:
        return [
            (int(r[0]), r[1], r[2])
            for r in conn.execute(text("SELECT job_id, started, ended FROM wf_runs"))
        ]


def busy(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM sqla_jobs_job WHERE state = 'running' "
                    "AND locked_by LIKE :like"
                ),
                {"like": f"%:{pid}:%"},
            ).scalar_one()
        )


@injects(
    f"SIGKILL of a random busy one of {WORKERS} worker processes, {KILLS} times {KILL_EVERY} s "
    f"apart through {GRAPHS} graphs (3 roots -> fan-in -> tail, Session handlers of 50-150 ms); "
    "each restarted at once (lease 2 s, poll 5 s)"
)
def test_workflows_killed_mid_graph_run_each_job_once_and_never_early(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Kill -9 mid-graph: each job takes effect once, no child starts before its parents ended"""
    rng = random.Random(20261206)
    with clean.begin() as conn:
        for ddl in RUNS_DDL:
            conn.execute(text(ddl))
    parents, doomed = enqueue_graphs(clean, rng)
    total = len(parents)
    fleet = Fleet(migrated_url, tmp_path, OPTIONS, target=TARGET)
    kills = 0
    try:
        fleet.start_together(WORKERS, clean, jobs)
        started = last_kill = time.monotonic()
        while (left := unfinished(clean)) > 0:
            assert time.monotonic() - started < DEADLINE, f"{left} jobs left:\n{fleet.logs()}"
            if kills < KILLS and time.monotonic() >= last_kill + KILL_EVERY:
                caught = [w for w in fleet.alive() if busy(clean, w.pid)]
                if caught:
                    victim = rng.choice(caught)
                    victim.proc.kill()
                    victim.proc.wait(10)
                    kills += 1
                    last_kill = time.monotonic()
                    fleet.spawn()
            time.sleep(rng.uniform(0.0, 0.05))
        elapsed = time.monotonic() - started
        for worker in fleet.alive():
            fleet.wait_started(worker)
        codes = fleet.stop()
    finally:
        fleet.close()
    assert kills == KILLS, f"the graphs finished after {kills} of {KILLS} kills"
    assert set(codes.values()) == {0}, codes
    recorded = runs(clean)
    by_job: dict[int, list[tuple[object, object]]] = {}
    for job_id, s, e in recorded:
        by_job.setdefault(job_id, []).append((s, e))
    assert cancelled_by_parent(clean) == doomed, "a dead parent's dependents are not cancelled"
    assert set(by_job) == set(parents) - doomed, "jobs lost or unknown jobs recorded"
    twice = {j: r for j, r in by_job.items() if len(r) != 1}
    assert twice == {}, f"jobs that took effect more than once: {twice}"
    early = [
        (child, p)
        for child, ps in parents.items()
        if child not in doomed
        for p in ps
        if not by_job[child][0][0] > by_job[p][0][1]  # type: ignore[operator]
    ]
    assert early == [], f"children started before a parent ended: {early}"
    figures.record(
        workers=WORKERS, graphs=GRAPHS, jobs=total, kills=kills, lost=0, twice=0, early=0,
        cancelled_with_a_dead_parent=len(doomed),
        seconds=round(elapsed, 1),
    )  # fmt: skip
