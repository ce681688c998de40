"""Faults found from outside the worker: a row lock on one running job, a user table's foreign key
to the job table, a sync handler that overruns its timeout, and the rescue of a crashed worker's
prefetched jobs. Real worker processes (``fault_app``) on a real PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import DEADLINE, wait_until
from tests.reliability.chaos_app import Fleet, open_gate, queue_length, runs_by_job, scalar
from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.fault_app import (
    OVERRUN_TIMEOUT,
    TARGET,
    Hold,
    Overrun,
    Refuse,
    Sleep,
    jobs,
    lapse_witness,
    reaped,
    reset_fault_tables,
)
from tests.reliability.test_kill import held_by


@contextmanager
def fleet_of(url: str, log_dir: Path, *options: str) -> Iterator[Fleet]:
    """Worker processes of ``fault_app``; every one still running is SIGKILLed on the way out."""
    log_dir.mkdir(exist_ok=True)
    fleet = Fleet(url, log_dir, options, target=TARGET)
    try:
        yield fleet
    finally:
        fleet.close()


def rows_by_id(engine: Engine) -> dict[int, dict[str, Any]]:
    """What is left in the queue table, by id."""
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id, state, attempts, crashes, last_error FROM sqla_jobs_job")
        ).all()
    return {int(r.id): dict(r._mapping) for r in found}


def states(engine: Engine) -> dict[str, int]:
    """How many jobs are in the queue table, by state."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT state, count(*) FROM sqla_jobs_job GROUP BY state"))
        return {str(state): int(n) for state, n in rows}


# -- 1. a row lock on one running job --------------------------------------------------------------

#: 3 s at both sizes: the heartbeat comes every second, so a worker process the machine starves
#: for up to two seconds keeps its leases (with 2 s it failed on a loaded CI machine).
LOCK_LEASE = 3
#: The lock is held until a reaper has run this long after the lock was taken: past the unlocked
#: jobs' leases as they stood then (at most ``LOCK_LEASE`` away), so without renewals they expire.
LOCK_HOLD_S = scaled(4.5, 5)


def leases(engine: Engine, ids: list[int]) -> dict[int, tuple[str | None, datetime | None]]:
    """Each job's lease token and expiry (a plain read: never waits on a row lock)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, lease_token::text, lease_expires_at FROM sqla_jobs_job "
                "WHERE id = any(:ids)"
            ),
            {"ids": ids},
        ).all()
    return {int(r[0]): (r[1], r[2]) for r in rows}


@injects(
    "SELECT ... FOR UPDATE on one of three running jobs (each held until the lock is released), "
    f"held by another connection for about {LOCK_HOLD_S} s (lease {LOCK_LEASE} s), while a second worker runs"
)
def test_a_row_lock_on_one_running_job_delays_only_that_jobs_lease_renewal(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """A row lock held on one running job (SELECT ... FOR UPDATE in another transaction, past the
    lease) while a second worker runs: the worker's other running jobs keep their leases and run
    exactly once; only the locked job may be reaped and run again.

    The locked job's lease cannot be renewed while the lock is held (renewing it writes the row),
    so it may expire and be rescued by another worker once the lock is released: that job running
    twice is allowed.
    """
    reset_fault_tables(clean)
    with Session(clean) as session:
        # Held until the test opens the gate: still running when their leases are read, however
        # long a loaded machine takes to reach the reap (a fixed-length job could end first).
        ids = jobs.enqueue_many(session, [Hold(gate="lock") for _ in range(3)])
        session.commit()
    # The lowest id: a renewal of all three updates the rows in id order, so it waits on this one
    # before it touches the others (today's renewal then holds no other row, and the second
    # worker's reaper sees the others' leases lapse).
    locked, others = min(ids), sorted(ids)[1:]
    options = ("--lease", str(LOCK_LEASE), "--concurrency", "3", "--poll-interval", "0.2")
    with fleet_of(migrated_url, tmp_path / "workers", *options) as fleet:
        first = fleet.spawn()
        wait_until(lambda: held_by(clean, first.pid) == set(ids), "the first worker runs all three")
        with clean.connect() as locker:
            locker.execute(
                text("SELECT id FROM sqla_jobs_job WHERE id = :id FOR UPDATE"), {"id": locked}
            )
            locked_at = time.monotonic()
            before = leases(clean, others)
            witness = lapse_witness(clean, LOCK_HOLD_S)
            fleet.wait_started(fleet.spawn())
            wait_until(
                lambda: reaped(clean, witness),
                f"a reap {LOCK_HOLD_S} s after the lock was taken",
                timeout=LOCK_HOLD_S + 15,
            )
            during = leases(clean, others)
            db_now = locker.execute(text("SELECT clock_timestamp()")).scalar_one()
            locker.rollback()
        held_s = time.monotonic() - locked_at
        open_gate(clean, "lock")

        def settled() -> bool:
            runs = runs_by_job(clean)
            gone = not set(others) & set(rows_by_id(clean))
            return any(runs[i] > 1 for i in others) or (gone and all(runs[i] for i in others))

        wait_until(settled, "the unlocked jobs done")
        # The locked job may still be running again somewhere: that is allowed, and not waited for.
    runs = runs_by_job(clean)
    reran = {i: runs[i] for i in others if runs[i] != 1}
    assert reran == {}, (
        f"jobs nobody locked ran more than once (job: runs) while job {locked} was locked:\n"
        f"{fleet.logs()}"
    )
    for job_id in others:
        token, expires = during.get(job_id, (None, None))
        assert token == before[job_id][0], f"job {job_id} changed hands while another was locked"
        assert expires is not None, f"job {job_id}: no lease while job {locked} was locked"
        assert expires > db_now, (
            f"job {job_id}: lease not renewed while job {locked} was locked "
            f"(expires {expires}, now {db_now}, at lock {before[job_id][1]})"
        )
    figures.record(
        lease_s=LOCK_LEASE,
        lock_held_s=round(held_s, 1),
        unlocked_jobs=len(others),
        unlocked_reruns=sum(runs[i] - 1 for i in others),
        locked_job_runs=runs[locked],
    )


# -- 2. a user table with a foreign key to the job table -------------------------------------------

FK_JOBS = scaled(20, 200)
FK_LEASE = 2


@injects(
    f"a user table with a foreign key to the job table, pointing at one of {FK_JOBS} short jobs "
    "and at a job whose handler fails"
)
def test_a_user_foreign_key_to_a_job_never_kills_the_worker(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """A user table with a foreign key to the job table, referencing one job of a batch: the worker
    keeps running, the referenced job runs once and is kept as 'completed' (never run again), and
    every other job of the batch is deleted after running once.

    A failing handler on a referenced job is recorded as an ordinary failure (the row is updated,
    not deleted, so the foreign key is no obstacle).
    """
    reset_fault_tables(clean)
    with clean.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS fault_note"))
        conn.execute(
            text(
                "CREATE TABLE fault_note (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " job_id bigint NOT NULL REFERENCES sqla_jobs_job (id))"
            )
        )
    try:
        with Session(clean) as session:
            ids = jobs.enqueue_many(session, [Sleep(ms=10) for _ in range(FK_JOBS)])
            [refused] = jobs.enqueue_many(session, [Refuse()])
            kept = ids[len(ids) // 3]
            for job_id in (kept, refused):
                session.execute(
                    text("INSERT INTO fault_note (job_id) VALUES (:id)"), {"id": job_id}
                )
            session.commit()
        started = time.monotonic()
        options = ("--lease", str(FK_LEASE), "--concurrency", "4", "--poll-interval", "0.2")
        with fleet_of(migrated_url, tmp_path / "workers", *options) as fleet:
            worker = fleet.spawn()
            idle = "SELECT count(*) = 0 FROM sqla_jobs_job WHERE state IN ('pending', 'running')"
            wait_until(
                lambda: worker.proc.poll() is not None or scalar(clean, idle),
                "the batch run (or the worker dead)",
                timeout=60,
            )
            assert worker.proc.poll() is None, (
                f"the worker process died (exit {worker.proc.poll()}) on a job referenced by a "
                f"user table; jobs left by state: {states(clean)}\n{worker.log[-3000:]}"
            )
            elapsed = time.monotonic() - started
            # A job leased now, and abandoned: once it is reaped (and run), a reap came later than
            # a lease taken when the batch was done, and found nothing else to rescue.
            witness = lapse_witness(clean, FK_LEASE)
            wait_until(
                lambda: runs_by_job(clean)[witness] == 1 and witness not in rows_by_id(clean),
                "the abandoned witness job reaped and run",
            )
            codes = fleet.stop()
        assert codes == {worker.pid: 0}, f"not a clean stop on SIGTERM: {codes}\n{fleet.logs()}"
        left = rows_by_id(clean)
        assert set(left) == {kept, refused}, (
            {i: (r["state"], r["last_error"]) for i, r in left.items()},
            fleet.logs()[-6000:],
        )
        assert left[kept]["state"] == "completed", left[kept]
        assert left[refused]["state"] == "dead", left[refused]
        assert "refused on purpose" in str(left[refused]["last_error"]), left[refused]
        runs = runs_by_job(clean)
        wrong = {i: runs[i] for i in [*ids, refused] if runs[i] != 1}
        assert wrong == {}, "jobs that did not run exactly once (job: runs)"
        assert scalar(clean, "SELECT count(*) FROM fault_note") == 2
    finally:
        with clean.begin() as conn:
            # The foreign key would stop every later TRUNCATE of the job table.
            conn.execute(text("DROP TABLE IF EXISTS fault_note"))
    figures.record(
        jobs=FK_JOBS + 1,
        referenced=2,
        worker_exits=0,
        kept_completed=1,
        reruns=0,
        seconds=round(elapsed, 1),
    )


# -- 3. a sync handler past its timeout ------------------------------------------------------------

OVERRUN_JOBS = scaled(2, 4)
OVERRUN_MS = scaled(2000, 3000)
OVERRUN_KEY = "k1"


def key_runs(engine: Engine) -> list[tuple[int, int, int, datetime, datetime | None]]:
    """Every run of the overrunning kind: job, attempt, pid, start, end (database clock)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT job_id, attempt, pid, started_at, ended_at FROM fault_runs "
                "ORDER BY started_at, seq"
            )
        ).all()
    return [(int(r[0]), int(r[1]), int(r[2]), r[3], r[4]) for r in rows]


@injects(
    f"a sync handler that ignores its {OVERRUN_TIMEOUT:g} s timeout and runs {OVERRUN_MS} ms, "
    f"{OVERRUN_JOBS} jobs of one concurrency key (limit 1, max_attempts 2), two workers"
)
def test_a_sync_handler_past_its_timeout_never_overlaps_its_retry_or_its_keys_next_job(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """A sync handler that runs past its timeout (a thread cannot be stopped): no two runs of the
    same concurrency key (limit 1) overlap, and a job's retry never starts before its previous run
    ended; each run is recorded as a failure ('timed out') once its thread returns."""
    reset_fault_tables(clean)
    with Session(clean) as session:
        ids = jobs.enqueue_many(
            session, [Overrun(key=OVERRUN_KEY, ms=OVERRUN_MS) for _ in range(OVERRUN_JOBS)]
        )
        session.commit()
    started = time.monotonic()
    options = ("--lease", "2", "--concurrency", "2", "--poll-interval", "0.2")
    with fleet_of(migrated_url, tmp_path / "workers", *options) as fleet:
        for _ in range(2):
            fleet.spawn()
        unfinished = (
            "SELECT (SELECT count(*) FROM sqla_jobs_job WHERE state <> 'dead')"
            " + (SELECT count(*) FROM fault_runs WHERE ended_at IS NULL)"
        )
        wait_until(
            lambda: scalar(clean, unfinished) == 0 and queue_length(clean) == OVERRUN_JOBS,
            "every job dead and every run ended",
            timeout=2 * OVERRUN_JOBS * OVERRUN_MS / 1000 + 30,
        )
        elapsed = time.monotonic() - started
        codes = fleet.stop()
    runs = key_runs(clean)
    overlaps = [
        f"job {a[0]} attempt {a[1]} (pid {a[2]}) {a[3]:%H:%M:%S.%f}-{a[4]:%H:%M:%S.%f} and "
        f"job {b[0]} attempt {b[1]} (pid {b[2]}) from {b[3]:%H:%M:%S.%f}"
        for a, b in pairwise(runs)
        if a[4] is not None and b[3] < a[4]
    ]
    assert overlaps == [], f"runs of key {OVERRUN_KEY} (limit 1) overlapped: {overlaps}"
    for job_id in ids:
        mine = [r for r in runs if r[0] == job_id]
        early = [(a[1], b[1]) for a, b in pairwise(mine) if a[4] is not None and b[3] < a[4]]
        assert early == [], f"job {job_id}: a retry started before its previous run ended"
        assert len(mine) == 2, f"job {job_id} ran {len(mine)} times, max_attempts is 2"
    left = rows_by_id(clean)
    for job_id in ids:
        assert left[job_id]["state"] == "dead", left[job_id]
        assert "timed out" in str(left[job_id]["last_error"]), left[job_id]
    assert set(codes.values()) == {0}, codes
    figures.record(
        jobs=OVERRUN_JOBS,
        runs=len(runs),
        timeout_s=OVERRUN_TIMEOUT,
        handler_s=OVERRUN_MS / 1000,
        overlapping_runs=len(overlaps),
        seconds=round(elapsed, 1),
    )


# -- 4. rescue after a crash -----------------------------------------------------------------------

RESCUE_JOBS = scaled(200, 1000)
RESCUE_LEASE = 2
#: Seconds after the kill plus the lease by which every rescued job must be done.
RESCUE_WITHIN = 15.0


@injects(
    f"SIGKILL of a worker holding {RESCUE_JOBS} claimed jobs of 50 ms (prefetch {RESCUE_JOBS}, "
    f"lease {RESCUE_LEASE} s); two fresh workers of concurrency 8 rescue them"
)
def test_jobs_rescued_after_a_crash_run_at_near_normal_throughput(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """A worker SIGKILLed while holding hundreds of prefetched jobs: once their leases expire, two
    fresh workers run them all within seconds, and none goes dead.

    The rescued jobs each carry a crash. A job that crashes its worker on every run must still
    not take the healthy jobs held with it dead (``test_poison.py``): crashed jobs may be kept
    apart, but not run at one per worker per poll.
    """
    reset_fault_tables(clean)
    with Session(clean) as session:
        ids = jobs.enqueue_many(session, [Sleep(ms=50) for _ in range(RESCUE_JOBS)])
        session.commit()
    lease = ("--lease", str(RESCUE_LEASE), "--concurrency", "8")
    with (
        fleet_of(
            migrated_url, tmp_path / "crashed", *lease, "--prefetch", str(RESCUE_JOBS)
        ) as crashed,
        fleet_of(migrated_url, tmp_path / "rescue", *lease) as rescue,
    ):
        victim = crashed.spawn()
        pending = "SELECT count(*) FROM sqla_jobs_job WHERE state = 'pending'"
        wait_until(
            lambda: scalar(clean, pending) == 0 and held_by(clean, victim.pid),
            "every job claimed",
            timeout=30,
        )
        victim.proc.kill()
        killed_at = time.monotonic()
        victim.proc.wait(10)
        # The dead worker's rows cannot change until its leases expire: read now, every job it held.
        held = held_by(clean, victim.pid)
        for rescuer in [rescue.spawn() for _ in range(2)]:
            rescue.wait_started(rescuer, timeout=DEADLINE)
        # The window opens when the rescuers are up: a process's start on a loaded machine is not
        # the rescue's speed.
        up_at = time.monotonic()
        limit = RESCUE_LEASE + RESCUE_WITHIN
        try:
            wait_until(
                lambda: queue_length(clean) == 0,
                "every job done",
                timeout=up_at + limit - time.monotonic(),
            )
        except AssertionError:
            left = rows_by_id(clean)
            dead = sum(row["state"] == "dead" for row in left.values())
            raise AssertionError(
                f"{len(left)} of the {len(held)} jobs the killed worker held not done {limit:g} s "
                f"after the kill and the rescuers' start (lease {RESCUE_LEASE} s), {dead} of them "
                f"dead\n"
                f"{rescue.logs()[-3000:]}"
            ) from None
        rescue_s = time.monotonic() - killed_at
        codes = rescue.stop()
    assert set(codes.values()) == {0}, codes
    assert rows_by_id(clean) == {}, "jobs left (dead) after the rescue"
    runs = runs_by_job(clean)
    assert [i for i in ids if runs[i] == 0] == [], "jobs completed without running"
    figures.record(
        jobs=RESCUE_JOBS,
        held_at_kill=len(held),
        lease_s=RESCUE_LEASE,
        rescue_s=round(rescue_s, 1),
        jobs_per_s=round(len(held) / max(rescue_s - RESCUE_LEASE, 0.1), 1),
        dead=0,
    )
