"""Periodic schedules in real worker processes: two ``sqla-jobs worker`` processes both run the
scheduler, each tick is enqueued once across them, and each tick's job starts on time.

Workers run ``python -m sqla_jobs.cli worker tests.acceptance.periodic_app:jobs`` with a poll
interval of 30 s, so no tick is started on time by a poll. Both schedulers race for both schedules;
one worker works the ``beat`` queue (a tick every second), the other the ``offbeat`` queue (a tick
every four seconds).

Why two: a tick is enqueued two seconds ahead, and the enqueue itself notifies the queue. On a
one-second schedule the enqueue of tick t + 2 s happens at t, so ``beat``'s worker is woken at
each tick by that NOTIFY as much as by the scheduler's NOTIFY at the tick. ``offbeat``'s queue hears
its enqueue NOTIFYs two seconds before and after each of its ticks and nothing between: an
``offbeat`` tick that starts within the second was started by the scheduler's NOTIFY at the tick.

What was enqueued is read from the queue and history tables (``meta->>'tick'``), what ran and when
from ``periodic_runs``; every time compared is the database's.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests._waiting import wait_until
from tests.acceptance._processes import DEADLINE, WorkerProcess
from tests.acceptance.periodic_app import BEAT, INTERVALS, OFFBEAT, RUNS_DDL, RUNS_TABLE

TARGET = "tests.acceptance.periodic_app:jobs"
#: A poll far longer than the test: only a NOTIFY can start a tick on time.
OPTIONS = ("--poll-interval", "30", "--concurrency", "2", "--keep-history")
#: ``beat`` ticks observed after both workers are up, each checked for its start.
WINDOW = 6
#: ``offbeat`` ticks observed after both workers are up.
OFFBEAT_WINDOW = 2
#: How late after its tick a job may start.
ON_TIME = timedelta(seconds=1)

Spawn = Callable[..., WorkerProcess]


@pytest.fixture
def runs(clean: Engine) -> Iterator[Engine]:
    """The engine, with an empty ``periodic_runs`` and no schedule state (and empty queue); the
    schedules' rows are deleted afterwards, so that no later listing shows them."""
    with clean.begin() as conn:
        conn.execute(text(RUNS_DDL))
        conn.execute(text(f"TRUNCATE {RUNS_TABLE}, sqla_jobs_schedule"))
    yield clean
    with clean.begin() as conn:
        conn.execute(
            text("DELETE FROM sqla_jobs_schedule WHERE name = any(:names)"),
            {"names": list(INTERVALS)},
        )


def db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        now: datetime = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    return now


def ran_ticks(engine: Engine, schedule: str) -> list[datetime]:
    """The ticks of ``schedule`` whose job has started, in order."""
    with engine.connect() as conn:
        found = conn.execute(
            text(f"SELECT DISTINCT tick FROM {RUNS_TABLE} WHERE schedule = :s ORDER BY tick"),
            {"s": schedule},
        ).scalars()
        return list(found)


def enqueued(engine: Engine, schedule: str) -> list[tuple[int, datetime, str]]:
    """(job id, tick, state) of every job ``schedule`` enqueued, pending or finished, by id."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, meta->>'tick', state::text FROM sqla_jobs_job "
                "WHERE meta->>'schedule' = :s "
                "UNION ALL SELECT id, meta->>'tick', outcome FROM sqla_jobs_history "
                "WHERE meta->>'schedule' = :s ORDER BY 1"
            ),
            {"s": schedule},
        ).all()
    return [(int(i), datetime.fromisoformat(t), s) for i, t, s in rows]


def runs_of(engine: Engine, schedule: str) -> list[tuple[int, datetime, int, int, datetime]]:
    """(job id, payload tick, attempt, pid, started_at) of every run of ``schedule``'s jobs."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT job_id, tick, attempt, pid, started_at FROM {RUNS_TABLE} "
                "WHERE schedule = :s ORDER BY seq"
            ),
            {"s": schedule},
        ).all()
    return [(int(j), t, int(a), int(p), s) for j, t, a, p, s in rows]


def schedule_row(engine: Engine, schedule: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT last_tick_at, last_job_id FROM sqla_jobs_schedule WHERE name = :n"),
            {"n": schedule},
        ).one()


def check_schedule(
    engine: Engine, schedule: str, first: datetime, last: datetime, worker: WorkerProcess
) -> dict[str, float]:
    """Assert that ``schedule`` enqueued each of its ticks exactly once, with no gap, from its
    first at or after ``first`` (or before) to past ``last``; that its row records the last; and that each tick from ``first``
    to ``last`` ran once, in ``worker``, completed, and started within ON_TIME after its tick.
    Returns each of those ticks' start delays in seconds."""
    interval = INTERVALS[schedule]
    jobs = enqueued(engine, schedule)
    ticks = sorted(t for _, t, _ in jobs)
    twice = {t.isoformat(): n for t, n in Counter(ticks).items() if n > 1}
    assert twice == {}, f"{schedule}: ticks enqueued more than once: {twice}"
    gaps = [(a.isoformat(), b.isoformat()) for a, b in pairwise(ticks) if b - a != interval]
    assert gaps == [], f"{schedule}: consecutive ticks not {interval} apart: {gaps}"
    assert ticks[0] < first + interval, (schedule, ticks[0], first)
    assert ticks[-1] >= last, (schedule, ticks[-1], last)
    last_tick_at, last_job_id = schedule_row(engine, schedule)
    assert last_tick_at == ticks[-1], schedule
    assert last_job_id == max(jobs, key=lambda j: j[1])[0], schedule

    tick_of = {job_id: t for job_id, t, _ in jobs}
    state_of = {job_id: s for job_id, _, s in jobs}
    recorded = runs_of(engine, schedule)
    assert {job_id for job_id, *_ in recorded} <= set(tick_of), "a run of a job never enqueued"
    for job_id, payload_tick, _, pid, _ in recorded:
        assert payload_tick == tick_of[job_id], f"job {job_id}: payload and meta ticks differ"
        assert pid == worker.proc.pid, f"job {job_id} ran in {pid}, not in its queue's worker"
    window = {job_id for job_id, t in tick_of.items() if first <= t <= last}
    ran = Counter(job_id for job_id, *_ in recorded if job_id in window)
    assert ran == Counter(dict.fromkeys(window, 1)), f"{schedule}: not every tick ran once"
    assert {state_of[j] for j in window} == {"completed"}, schedule
    delays = {
        tick_of[job_id].isoformat(): (started_at - tick_of[job_id]).total_seconds()
        for job_id, _, _, _, started_at in recorded
        if job_id in window
    }
    early = {t: d for t, d in delays.items() if d < 0}
    assert early == {}, f"{schedule}: ticks started before their time (seconds after): {delays}"
    late = {t: d for t, d in delays.items() if d >= ON_TIME.total_seconds()}
    assert late == {}, f"{schedule}: ticks started {ON_TIME} or more after their time: {delays}"
    return delays


def test_two_worker_processes_enqueue_each_tick_once_and_start_it_within_a_second(
    runs: Engine, spawn_worker: Spawn
) -> None:
    beat_worker = spawn_worker(*OPTIONS, "--queues", BEAT, target=TARGET)
    offbeat_worker = spawn_worker(*OPTIONS, "--queues", OFFBEAT, target=TARGET)
    workers = (beat_worker, offbeat_worker)
    try:
        for w in workers:
            w.wait_logged("started")
            assert "schedules=2" in w.log, f"the worker does not run both schedules:\n{w.log}"
        # Both are up: from the next whole second on, both schedulers race for every tick. The
        # window starts a second later still, for both LISTENs to be in place.
        up = db_now(runs)
        first = up.replace(microsecond=0) + 2 * INTERVALS[BEAT]
        last = first + (WINDOW - 1) * INTERVALS[BEAT]

        def window_ran() -> bool:
            beats = ran_ticks(runs, BEAT)
            offbeats = [t for t in ran_ticks(runs, OFFBEAT) if t >= first]
            return bool(beats) and beats[-1] >= last and len(offbeats) >= OFFBEAT_WINDOW

        wait_until(
            window_ran,
            f"the ticks from {first.isoformat()} run",
            timeout=(last - up + OFFBEAT_WINDOW * INTERVALS[OFFBEAT]).total_seconds() + DEADLINE,
        )
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        assert w.proc.wait(DEADLINE) == 0, w.log

    check_schedule(runs, BEAT, first, last, beat_worker)
    off_last = [t for t in ran_ticks(runs, OFFBEAT) if t >= first][OFFBEAT_WINDOW - 1]
    check_schedule(runs, OFFBEAT, first, off_last, offbeat_worker)
