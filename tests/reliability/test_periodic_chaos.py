"""Kill -9 of schedulers: worker processes that all run the scheduler of a one-second schedule are
SIGKILLed while they run, some in the middle of a tick's transaction, some while they run a tick's
job; each tick is still enqueued exactly once, none is missed, and every tick's job runs.

There is no leader to lose: the tick a killed scheduler was enqueueing is rolled back with the
compare-and-set that claimed it, and another scheduler enqueues it (ticks are enqueued two seconds
ahead, so well before their time); the job a killed worker was running is reaped when its lease
expires and run again.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from datetime import datetime, timedelta
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from tests._waiting import wait_until
from tests.reliability.chaos_app import Fleet, WorkerProcess, runs_by_job
from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.schedule_app import (
    INTERVAL,
    SCHEDULE,
    TARGET,
    WORK_MS,
    reset_schedule_tables,
)

WORKERS = 4
#: How long the schedulers run under fire, in seconds.
DURATION = scaled(8, 60)
#: Kills spread evenly over the run; every other one aims at a scheduler inside a tick's
#: transaction, the others at a worker running a tick's job. Each victim is replaced at once.
KILLS = scaled(2, 12)
#: Short leases, so a killed worker's job is rescued within about three seconds.
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
#: A job no kill touched starts this soon after its tick (a killed scheduler's NOTIFY is lost, so
#: its ticks start at the next poll, 0.2 s).
ON_TIME = timedelta(seconds=1)
#: After the run: how long the jobs of the ticks passed may take to complete (a rescue included).
DRAIN = 30.0
#: How long to look for a scheduler inside a tick's transaction from a whole second, and at how
#: many whole seconds in a row before killing a busy worker instead.
MID_TICK_WINDOW = 0.3
MID_TICK_TRIES = 3


def db_epoch(engine: Engine) -> float:
    """The database clock, in seconds since the epoch."""
    with engine.connect() as conn:
        return float(
            conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one()
        )


def held_by(engine: Engine, pid: int) -> set[int]:
    """The jobs whose lease the worker process ``pid`` holds (worker names are host:pid:random)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id FROM sqla_jobs_job WHERE state = 'running' AND locked_by LIKE :like"),
            {"like": f"%:{pid}:%"},
        )
        return {int(r[0]) for r in rows}


def sessions_gone(engine: Engine, worker: WorkerProcess) -> bool:
    """Whether no backend of ``worker`` (its own connections or its handlers') is left."""
    with engine.connect() as conn:
        left = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND (application_name = :app OR application_name LIKE :like)"
            ),
            {"app": worker.app_name, "like": f"sqla-jobs % %:{worker.pid}:%"},
        ).scalar_one()
    return int(left) == 0


def scheduler_in_tick(
    engine: Engine, workers: list[WorkerProcess]
) -> tuple[WorkerProcess, int] | None:
    """The worker whose scheduler is inside a tick's transaction, and that transaction's id: its
    connection has written (the compare-and-set on the schedule row), so it holds an xid."""
    with engine.connect() as conn:
        writing = conn.execute(
            text(
                "SELECT application_name, backend_xid::text::bigint FROM pg_stat_activity "
                "WHERE datname = current_database() AND backend_xid IS NOT NULL "
                "AND application_name LIKE 'sqla-jobs scheduler %'"
            )
        ).all()
    return next(
        ((w, int(xid)) for w in workers for name, xid in writing if f":{w.pid}:" in name), None
    )


def xact_status(engine: Engine, xid: int) -> str | None:
    """'committed', 'aborted' or 'in progress', for a 32-bit ``xid`` of the current epoch."""
    with engine.connect() as conn:
        xmax = int(
            conn.execute(text("SELECT txid_snapshot_xmax(txid_current_snapshot())")).scalar_one()
        )
        epoch = (xmax >> 32) - (1 if xid > xmax & 0xFFFFFFFF else 0)
        status: str | None = conn.execute(
            text("SELECT txid_status(:full)"), {"full": (epoch << 32) | xid}
        ).scalar()
    return status


def xact_ended(engine: Engine, xid: int) -> str | None:
    """How transaction ``xid`` ended ('committed' or 'aborted'); None while it is in progress."""
    status = xact_status(engine, xid)
    return None if status == "in progress" else status


def enqueued(engine: Engine) -> list[tuple[int, datetime, str, int, int]]:
    """(job id, tick, state or outcome, attempts, crashes) of every job the schedule enqueued,
    waiting or finished, by id."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, meta->>'tick', state::text, attempts, crashes FROM sqla_jobs_job "
                "WHERE meta->>'schedule' = :s "
                "UNION ALL SELECT id, meta->>'tick', outcome, attempts, crashes "
                "FROM sqla_jobs_history WHERE meta->>'schedule' = :s ORDER BY 1"
            ),
            {"s": SCHEDULE},
        ).all()
    return [(int(i), datetime.fromisoformat(t), s, int(a), int(c)) for i, t, s, a, c in rows]


def starts(engine: Engine) -> list[tuple[int, datetime, datetime]]:
    """(job id, payload tick, started_at) of every run started, in the order recorded."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_id, tick, started_at FROM schedule_runs ORDER BY seq")
        ).all()
    return [(int(j), t, s) for j, t, s in rows]


def waiting_up_to(engine: Engine, cutoff: datetime) -> int:
    """The schedule's jobs due by ``cutoff`` and not completed yet."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM sqla_jobs_job "
                    "WHERE meta->>'schedule' = :s AND run_at <= :cutoff"
                ),
                {"s": SCHEDULE, "cutoff": cutoff},
            ).scalar_one()
        )


def forget_schedule(engine: Engine) -> None:
    """Delete the schedule's row, so that no later listing shows it."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_schedule WHERE name = :n"), {"n": SCHEDULE})


def schedule_row(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT last_tick_at, last_job_id FROM sqla_jobs_schedule WHERE name = :n"),
            {"n": SCHEDULE},
        ).one()


@injects(
    f"SIGKILL, {KILLS} times over {DURATION} s, of one of {WORKERS} worker processes that all run "
    "the scheduler of an every-1 s schedule: every other time one caught inside a tick's "
    f"transaction, else one running a tick's {WORK_MS} ms job; each restarted at once (lease 2 s)"
)
def test_sigkilled_schedulers_enqueue_every_tick_exactly_once_and_every_tick_runs(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Kill -9 of schedulers: every tick enqueued exactly once, none missed, every tick's job run"""
    reset_schedule_tables(clean)
    rng = random.Random(20240917)
    fleet = Fleet(migrated_url, tmp_path, OPTIONS, target=TARGET)
    kills = mid_tick = rolled_back = 0
    hits: set[int] = set()
    try:
        for _ in range(WORKERS):
            fleet.spawn()
        for w in fleet.workers:
            fleet.wait_started(w)
        offset = db_epoch(clean) - time.time()
        begin = time.monotonic()
        for k in range(KILLS):
            time.sleep(max(0.0, begin + DURATION * (k + 1) / (KILLS + 1) - time.monotonic()))
            victim = None
            xid = None
            if k % 2 == 0:
                # A scheduler plans a tick LOOKAHEAD (whole seconds) before it, so the race for a
                # one-second schedule's tick starts at each whole second of the database clock.
                # Looked for from just before each of MID_TICK_TRIES whole seconds, as long as a
                # race may take.
                found = None
                for _ in range(MID_TICK_TRIES):
                    now = time.time() + offset
                    time.sleep(max(0.0, math.floor(now) + 1 - now - 0.01))
                    until = time.monotonic() + MID_TICK_WINDOW
                    while found is None and time.monotonic() < until:
                        found = scheduler_in_tick(clean, fleet.alive())
                    if found is not None:
                        victim, xid = found
                        mid_tick += 1
                        break
            if victim is None:
                busy = wait_until(
                    lambda: [w for w in fleet.alive() if held_by(clean, w.pid)],
                    "a worker runs a tick's job",
                )
                victim = rng.choice(busy)
            victim.proc.kill()
            victim.proc.wait(10)
            # Once its sessions are gone, every transaction of the dead worker has ended, and its
            # rows cannot change until its leases expire (1.5 s at the soonest): every job it held
            # when it died is listed, a claim in flight at the kill included.
            wait_until(partial(sessions_gone, clean, victim), f"worker {victim.pid}'s sessions end")
            hits |= held_by(clean, victim.pid)
            kills += 1
            fleet.spawn()
            if xid is not None:
                # Whether the kill beat the commit: an aborted tick is one the others must enqueue.
                status = wait_until(
                    partial(xact_ended, clean, xid),
                    f"the killed scheduler's transaction {xid} ends",
                )
                rolled_back += status == "aborted"
        time.sleep(max(0.0, begin + DURATION - time.monotonic()))
        with clean.connect() as conn:
            cutoff: datetime = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        wait_until(
            lambda: waiting_up_to(clean, cutoff) == 0,
            f"every tick up to {cutoff.isoformat()} completed:\n{fleet.logs()}",
            timeout=DRAIN,
        )
        seconds = time.monotonic() - begin
        for w in fleet.alive():
            fleet.wait_started(w)  # a replacement still importing would die of the SIGTERM
        codes = fleet.stop()
        last_tick_at, last_job_id = schedule_row(clean)  # before forget_schedule
    finally:
        fleet.close()
        forget_schedule(clean)

    assert kills == KILLS
    assert set(codes.values()) == {0}, f"a surviving worker did not stop cleanly: {codes}"
    jobs = enqueued(clean)
    ticks = sorted(t for _, t, *_ in jobs)
    # Exactly once, with no gap: from the first tick to the last, each second has one job.
    twice = {t.isoformat(): n for t, n in Counter(ticks).items() if n > 1}
    assert twice == {}, f"ticks enqueued more than once: {twice}"
    gaps = [(a.isoformat(), b.isoformat()) for a, b in pairwise(ticks) if b - a != INTERVAL]
    assert gaps == [], f"consecutive ticks not {INTERVAL} apart: {gaps}"
    assert ticks[-1] >= cutoff, "the ticks up to the end of the run were enqueued"
    assert len(ticks) >= DURATION, f"only {len(ticks)} ticks in a {DURATION} s run"
    # The schedule's state is the last tick enqueued, and its job.
    assert last_tick_at == ticks[-1]
    assert last_job_id == max(jobs, key=lambda j: j[1])[0]

    # Every tick passed ran to completion; those enqueued ahead of the end wait for a worker.
    unfinished = {t.isoformat(): s for _, t, s, *_ in jobs if t <= cutoff and s != "completed"}
    assert unfinished == {}, f"ticks passed whose job did not complete: {unfinished}"
    ahead = {t.isoformat(): s for _, t, s, *_ in jobs if t > cutoff}
    assert set(ahead.values()) <= {"pending", "completed"}, ahead
    completed = {i for i, _, s, *_ in jobs if s == "completed"}
    # Runs again only as rescues from a crash (a kill), never as a handler failure.
    failed = {i: (a, c) for i, _, s, a, c in jobs if s == "completed" and a - c != 1}
    assert failed == {}, f"completed jobs with a failed run (attempts, crashes): {failed}"
    finished = runs_by_job(clean)
    never = sorted(completed - set(finished))
    assert never == [], f"{len(never)} tick jobs completed without their handler finishing"
    tick_of = {i: t for i, t, *_ in jobs}
    started = starts(clean)
    assert {i for i, *_ in started} <= set(tick_of), "a run of a job never enqueued"
    for job_id, payload_tick, _ in started:
        assert payload_tick == tick_of[job_id], f"job {job_id}: payload and meta ticks differ"
    reran = {i: n for i, n in Counter(i for i, *_ in started).items() if n > 1}
    unexplained = {i: n for i, n in reran.items() if i not in hits}
    assert unexplained == {}, "tick jobs ran again though no kill hit them (job: runs)"

    # On time: no run before its tick; a job no kill touched started within ON_TIME of it.
    first: dict[int, float] = {}
    for job_id, _, at in started:
        first.setdefault(job_id, (at - tick_of[job_id]).total_seconds())
    early = {tick_of[i].isoformat(): d for i, d in first.items() if d < 0}
    assert early == {}, f"ticks started before their time (seconds after): {early}"
    untouched = {i: d for i, d in first.items() if i not in hits}
    late = {tick_of[i].isoformat(): d for i, d in untouched.items() if d >= ON_TIME.total_seconds()}
    assert late == {}, f"ticks started {ON_TIME} or more after their time (seconds): {late}"

    figures.record(
        workers=WORKERS,
        seconds=round(seconds, 1),
        ticks=len(ticks),
        kills=kills,
        kills_mid_tick=mid_tick,
        tick_transactions_rolled_back=rolled_back,
        jobs_held_at_kill=len(hits),
        duplicated=len(twice),
        missed=len(gaps),
        reruns=sum(n - 1 for n in reran.values()),
        max_start_delay_s=round(max(untouched.values()), 3),
    )
