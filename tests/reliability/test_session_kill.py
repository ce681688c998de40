"""Kill -9 and handlers that take a Session: worker processes SIGKILLed between a handler's write
and its job's completion leave every counter at exactly one per job, because the write and the
completion commit together; a plain handler that commits its own write counts again.

Each kill is aimed at a busy worker caught after a handler's write and before that job's
completion (chosen at random among such workers, at a random moment), so every kill tests the
window that matters. For the Session kinds, "caught" means the handler's transaction is open with
its write in it (``pg_stat_activity``); for the control, that its write is committed and its job
still running.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import wait_until
from tests.reliability.chaos_app import Fleet, WorkerProcess, queue_length
from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.session_app import COUNTER_DDL, TARGET, AsyncBump, Bump, PlainBump, jobs

WORKERS = 3
JOBS = scaled(200, 3000)
KILLS = scaled(5, 15)
CONTROL_JOBS = scaled(100, 1000)
CONTROL_KILLS = scaled(3, 10)
#: Short leases, so a killed worker's jobs are rescued within about two seconds; history kept, so
#: a completed job's ``crashes`` tells that a kill interrupted it.
OPTIONS = (
    "--concurrency",
    "4",
    "--lease",
    "2",
    "--heartbeat",
    "0.5",
    "--poll-interval",
    "0.2",
    "--keep-history",
)
DEADLINE = scaled(60, 400)
_JOB_COMMENT = re.compile(r"/\* job (\d+) \*/")


def reset(engine: Engine, counters: int) -> None:
    """Empty the queue and its history; counters 1..``counters`` at zero."""
    with engine.begin() as conn:
        for ddl in COUNTER_DDL:
            conn.execute(text(ddl))
        conn.execute(
            text("INSERT INTO app_counter (id) SELECT generate_series(1, :n)"), {"n": counters}
        )
        conn.execute(text("TRUNCATE sqla_jobs_job, sqla_jobs_history"))


def enqueue(engine: Engine, payloads: list[Bump]) -> dict[int, int]:
    """Enqueue ``payloads``; return each job's counter by job id."""
    with Session(engine) as session, session.begin():
        ids = jobs.enqueue_many(session, payloads)
    return {int(job_id): p.counter for job_id, p in zip(ids, payloads, strict=True)}


def held_by(engine: Engine, pid: int) -> set[int]:
    """The jobs whose lease the worker process ``pid`` holds (worker names are host:pid:random)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id FROM sqla_jobs_job WHERE state = 'running' AND locked_by LIKE :like"),
            {"like": f"%:{pid}:%"},
        )
        return {int(r[0]) for r in rows}


def open_writes(engine: Engine, worker: WorkerProcess) -> set[int]:
    """The jobs whose write sits in an open transaction of one of ``worker``'s handlers (a backend
    of its ``application_name`` holding a transaction id, its last statement naming the job).
    Only this database's backends: other test runs on the server name their workers alike."""
    with engine.connect() as conn:
        queries = conn.execute(
            text(
                "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = :app AND backend_xid IS NOT NULL"
            ),
            {"app": worker.app_name},
        ).scalars()
        return {int(m.group(1)) for q in queries if (m := _JOB_COMMENT.search(q or ""))}


def counter_values(engine: Engine, counter_of: dict[int, int], ids: set[int]) -> dict[int, int]:
    """The counter of each job of ``ids``, by job id."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, n FROM app_counter WHERE id = any(:ids)"),
            {"ids": sorted(counter_of[i] for i in ids)},
        )
        by_counter = {int(c): int(n) for c, n in rows}
    return {i: by_counter[counter_of[i]] for i in ids}


def still_queued(engine: Engine, ids: set[int]) -> set[int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id FROM sqla_jobs_job WHERE id = any(:ids)"), {"ids": sorted(ids)}
        )
        return {int(r[0]) for r in rows}


def backends_of(engine: Engine, worker: WorkerProcess) -> int:
    """How many server backends ``worker``'s connections still have (its own and its handlers')."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND (application_name = :app OR application_name LIKE :like)"
                ),
                {"app": worker.app_name, "like": f"sqla-jobs % %:{worker.pid}:%"},
            ).scalar_one()
        )


@dataclass
class Chaos:
    """The kills of one run, and what each found."""

    engine: Engine
    counter_of: dict[int, int]
    kills: int = 0
    #: Jobs a victim held when it died (claimed, running or buffered) and had not completed.
    held: set[int] = field(default_factory=set)
    #: Jobs whose write was in an open transaction when their worker died, and not committed.
    rolled_back: set[int] = field(default_factory=set)
    #: Per job, its counter right after the last kill that found it still in the queue: writes
    #: that survived the runs killed before their job's completion.
    left_behind: dict[int, int] = field(default_factory=dict)

    def caught(self, worker: WorkerProcess) -> set[int]:
        """Jobs of ``worker`` past their write and before their completion: the write in an open
        transaction, or committed with the job still running (more than a kill left behind)."""
        running = held_by(self.engine, worker.pid)
        if not running:
            return set()
        committed = {
            i
            for i, n in counter_values(self.engine, self.counter_of, running).items()
            if n > self.left_behind.get(i, 0)
        }
        return (open_writes(self.engine, worker) & running) | committed

    def kill(self, victim: WorkerProcess) -> None:
        """SIGKILL ``victim``, wait until the server has let go of its connections, and record
        what the kill left: which jobs it held, which writes rolled back, which stayed."""
        before = held_by(self.engine, victim.pid)
        in_flight = open_writes(self.engine, victim)
        victim.proc.kill()
        victim.proc.wait(10)
        # Until its backends are gone, a COMMIT it sent may still land: wait, then read.
        wait_until(lambda: backends_of(self.engine, victim) == 0, "the victim's backends end")
        held = before | held_by(self.engine, victim.pid)
        queued = still_queued(self.engine, held)
        values = counter_values(self.engine, self.counter_of, queued) if queued else {}
        # Read after the counters: a job still the victim's was not reaped, so no other worker had
        # run it when they were read. The database says so; a wall-clock bound would be the host's.
        reaped = queued - held_by(self.engine, victim.pid)
        assert not reaped, f"reaped before what the kill left was read: {sorted(reaped)}"
        self.kills += 1
        self.held |= queued
        self.rolled_back |= in_flight & queued
        self.left_behind.update({i: n for i, n in values.items() if n > 0})


def run_with_kills(
    engine: Engine, url: str, tmp_path: Path, counter_of: dict[int, int], kills: int, seed: int
) -> tuple[Chaos, float]:
    """Run the jobs of ``counter_of`` on a fleet, killing ``kills`` caught workers evenly through
    the run (each replaced at once); return the kills' record and the run's seconds."""
    rng = random.Random(seed)
    total = len(counter_of)
    chaos = Chaos(engine, counter_of)
    fleet = Fleet(url, tmp_path, OPTIONS, target=TARGET)
    try:
        fleet.start_together(WORKERS, engine, jobs)
        started = time.monotonic()
        deadline = started + DEADLINE
        while (left := queue_length(engine)) > 0:
            assert time.monotonic() < deadline, f"jobs left after {DEADLINE}s:\n{fleet.logs()}"
            due = chaos.kills < kills and total - left >= (chaos.kills + 1) * total // (kills + 1)
            if due:
                caught = [w for w in fleet.alive() if chaos.caught(w)]
                if caught:
                    chaos.kill(rng.choice(caught))
                    fleet.spawn()
            time.sleep(rng.uniform(0.0, 0.05))
        elapsed = time.monotonic() - started
        # A replacement still importing the application would die of the SIGTERM (exit -15).
        for worker in fleet.alive():
            fleet.wait_started(worker)
        codes = fleet.stop()
    finally:
        fleet.close()
    assert chaos.kills == kills, f"the queue drained after {chaos.kills} of {kills} kills"
    assert set(codes.values()) == {0}, f"a surviving worker did not stop cleanly: {codes}"
    return chaos, elapsed


def counts(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {int(c): int(n) for c, n in conn.execute(text("SELECT id, n FROM app_counter"))}


def history(engine: Engine) -> dict[int, int]:
    """The completed jobs' ``crashes``, by job id."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, crashes FROM sqla_jobs_history"))
        return {int(i): int(c) for i, c in rows}


@injects(
    f"SIGKILL of a random one of {WORKERS} worker processes caught between a handler's write and "
    f"its job's completion, {KILLS} times evenly through {JOBS} Session jobs (half sync, half "
    "async) of 50-150 ms; each restarted at once (lease 2 s)"
)
def test_sigkilled_session_handlers_count_every_job_exactly_once(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Kill -9 between a Session handler's write and its completion: every counter ends at 1"""
    rng = random.Random(20240917)
    reset(clean, JOBS)
    payloads: list[Bump] = [
        (Bump if i % 2 else AsyncBump)(counter=i + 1, ms=rng.randint(50, 150)) for i in range(JOBS)
    ]
    counter_of = enqueue(clean, payloads)
    chaos, elapsed = run_with_kills(clean, migrated_url, tmp_path, counter_of, KILLS, seed=7)

    assert queue_length(clean) == 0
    # No kill left a write behind: a job not completed at its worker's death had written nothing.
    assert chaos.left_behind == {}
    # Every kill tested something: writes in open transactions were rolled back with their run.
    assert chaos.rolled_back, "no kill caught a handler's write in an open transaction"
    final = counts(clean)
    assert {c: n for c, n in final.items() if n != 1} == {}, "counters not at exactly 1"
    assert sum(final.values()) == JOBS
    crashes = history(clean)
    assert set(crashes) == set(counter_of), "completed jobs and enqueued jobs differ"
    # Every job a kill interrupted was reaped (a crash counted) and completed by another worker.
    interrupted = {i for i, c in crashes.items() if c > 0}
    assert chaos.held <= interrupted
    figures.record(
        workers=WORKERS,
        jobs=JOBS,
        kills=chaos.kills,
        jobs_held_at_kill=len(chaos.held),
        writes_rolled_back_at_kill=len(chaos.rolled_back),
        completed_after_a_crash=len(interrupted),
        counted_twice=0,
        lost=JOBS - len(crashes),
        seconds=round(elapsed, 1),
    )


@injects(
    f"the same kills, {CONTROL_KILLS} times through {CONTROL_JOBS} jobs of a plain (payload, ctx) "
    "handler that commits its own Session before it returns (the control)"
)
def test_sigkilled_plain_handlers_that_commit_their_own_session_count_again(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Control: a handler committing its own Session counts again when killed before completion

    The same kills as above, on a ``(payload, ctx)`` handler that commits its write itself: each
    kill after that commit and before the job's completion leaves the write behind, and the job's
    next run writes again. Every counter ends at exactly one more than the writes its killed runs
    left behind, and some are at 2: what the Session handler exists to prevent.
    """
    rng = random.Random(20240918)
    reset(clean, CONTROL_JOBS)
    payloads: list[Bump] = [
        PlainBump(counter=i + 1, ms=rng.randint(50, 150)) for i in range(CONTROL_JOBS)
    ]
    counter_of = enqueue(clean, payloads)
    chaos, elapsed = run_with_kills(
        clean, migrated_url, tmp_path, counter_of, CONTROL_KILLS, seed=8
    )

    assert queue_length(clean) == 0
    final = counts(clean)
    expected = {counter_of[i]: 1 + chaos.left_behind.get(i, 0) for i in counter_of}
    assert final == expected
    twice = [c for c, n in final.items() if n > 1]
    assert twice, "no kill landed between a plain handler's commit and its job's completion"
    figures.record(
        workers=WORKERS,
        jobs=CONTROL_JOBS,
        kills=chaos.kills,
        jobs_held_at_kill=len(chaos.held),
        counted_twice=len(twice),
        extra_counts=sum(final.values()) - CONTROL_JOBS,
        seconds=round(elapsed, 1),
    )
