"""Clock skew: a worker process whose own clock is ten minutes off (libfaketime) still schedules,
leases and reaps by the database's clock.

sqla-jobs never reads Python's clock for a schedule: ``delay`` is added to ``now()``, leases are
``now() + lease``, the reaper compares with ``now()``. A worker whose host clock drifted (a VM
resumed from suspend, a broken NTP) must therefore behave exactly like one whose clock is right. The
worker runs under ``LD_PRELOAD=libfaketime.so.1 FAKETIME=+10m`` (and ``-10m``), which skews the wall
clock of the whole process (``time.time()``, ``datetime.now()``) and leaves the monotonic clock alone,
as real drift does. Handlers record the process's own clock next to the database's, so each test
also proves that the skew was really in effect.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.edge_app import (
    EFFECTS_DDL,
    EFFECTS_TABLE,
    EdgeWorker,
    Hold,
    edge_workers,
    jobs,
    wait_for,
)

FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    *sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")),
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
SKEWS = {"+10m": 600.0, "-10m": -600.0}
#: The skewed worker's lease and heartbeat; its reaper runs every lease / 2 seconds.
LEASE, HEARTBEAT = 6.0, 1.0
REAP_INTERVAL = LEASE / 2
POLL = 0.2
#: Scheduling slack we tolerate: a poll, a thread hand-off, a busy CI machine. A worker that read
#: its own clock would be off by the skew, 600 s.
SLACK = 2.5


def faketime_library() -> str:
    """The libfaketime preload library; the tests are skipped only if it is not installed."""
    for path in FAKETIME_LIBS:
        if Path(path).is_file():
            return path
    pytest.skip("libfaketime is not installed (apt-get install faketime)")


def skew_env(library: str, skew: str) -> dict[str, str]:
    """The environment that skews a process's wall clock by ``skew`` (libfaketime syntax)."""
    return {
        "LD_PRELOAD": library,
        "FAKETIME": skew,
        # Drift moves the wall clock, not CLOCK_MONOTONIC (and a monotonic clock pushed back ten
        # minutes would go negative on a machine booted less than ten minutes ago).
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@dataclass
class Skewed:
    """A running worker process on queue ``edge`` whose clock is off by ``seconds``."""

    name: str
    seconds: float
    url: str
    env: dict[str, str]
    worker: EdgeWorker
    spawn: Callable[..., EdgeWorker]


@pytest.fixture(scope="module", params=list(SKEWS))
def skewed(
    request: pytest.FixtureRequest,
    migrated_url: str,
    engine: Engine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Skewed]:
    """One skewed worker per skew, shared by the tests of this module."""
    library = faketime_library()
    with engine.begin() as conn:
        conn.execute(text(EFFECTS_DDL))
    env = skew_env(library, request.param)
    with edge_workers(tmp_path_factory.mktemp("clock")) as spawn:
        worker = spawn(
            migrated_url,
            "--queues",
            "edge",
            "--lease",
            str(LEASE),
            "--heartbeat",
            str(HEARTBEAT),
            "--poll-interval",
            str(POLL),
            env=env,
        )
        worker.wait_logged("started")
        yield Skewed(request.param, SKEWS[request.param], migrated_url, env, worker, spawn)
        assert worker.proc.poll() is None, f"the skewed worker died:\n{worker.log}"


@pytest.fixture
def fresh(engine: Engine) -> Engine:
    """The engine, with the queue and the effects emptied."""
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE sqla_jobs_job, sqla_jobs_history, {EFFECTS_TABLE}"))
    return engine


def effect_of(engine: Engine, job_id: int, event: str) -> Any:
    """The (db_at, py_at, pid, attempt, crashes) row of ``event`` for the job, or None."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                f"SELECT db_at, py_at, pid, attempt, crashes FROM {EFFECTS_TABLE} "
                "WHERE job_id = :id AND event = :event ORDER BY seq LIMIT 1"
            ),
            {"id": job_id, "event": event},
        ).first()


def wait_effect(engine: Engine, job_id: int, event: str, timeout: float = 20.0) -> Any:
    return wait_for(lambda: effect_of(engine, job_id, event), f"job {job_id} {event}", timeout)


def seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def assert_clock_skewed(row: Any, skew: Skewed) -> float:
    """The worker process's clock really was off by the skew; return the measured offset."""
    offset = seconds(row.py_at - row.db_at)
    assert abs(offset - skew.seconds) < 30, (
        f"the worker's clock is off by {offset:.1f}s, not {skew.seconds:+.0f}s: libfaketime did "
        "not take effect"
    )
    return offset


@injects("worker process wall clock skewed by +/-10 min (libfaketime)")
def test_skewed_worker_runs_a_due_job_promptly_and_a_delayed_job_not_before_it_is_due(
    skewed: Skewed, fresh: Engine, figures: Figures
) -> None:
    """A skewed worker runs a job with no delay promptly and a delayed job when the database
    says it is due: not early, not minutes late."""
    delay = scaled(3, 30)
    with Session(fresh) as session:
        due = jobs.enqueue(session, Hold(tag="due"))
        later = jobs.enqueue(session, Hold(tag="later"), delay=timedelta(seconds=delay))
        # Read before commit: committed jobs are the worker's, and deleted when done.
        due_id, due_created = due.id, due.created_at
        later_id, later_run_at = later.id, later.run_at
        session.commit()
    started = wait_effect(fresh, due_id, "started")
    offset = assert_clock_skewed(started, skewed)
    prompt = seconds(started.db_at - due_created)
    assert prompt < SLACK, f"a due job waited {prompt:.1f}s for a worker that polls every {POLL}s"
    # The delayed job must still be waiting: a worker comparing run_at with a clock ten minutes
    # fast would have run it together with the due one.
    assert effect_of(fresh, later_id, "started") is None

    ran = wait_effect(fresh, later_id, "started", timeout=delay + 20)
    after_due = seconds(ran.db_at - later_run_at)
    assert after_due >= 0, f"the delayed job ran {-after_due:.1f}s before it was due"
    assert after_due < SLACK, f"the delayed job ran {after_due:.1f}s after it was due"
    figures.record(
        skew=skewed.name,
        measured_offset_s=round(offset, 1),
        delay_s=delay,
        due_job_start_s=round(prompt, 3),
        delayed_job_start_after_due_s=round(after_due, 3),
    )


@injects("worker process wall clock skewed by +/-10 min (libfaketime)")
def test_lease_taken_by_a_skewed_worker_is_measured_from_the_database_clock(
    skewed: Skewed, fresh: Engine, figures: Figures
) -> None:
    """The lease a skewed worker holds ends ``lease`` seconds after the database's ``now()``
    (renewed every heartbeat), not ten minutes early or late."""
    with Session(fresh) as session:
        job_id = jobs.enqueue(session, Hold(tag="lease", seconds=2.0)).id
        session.commit()
    started = wait_effect(fresh, job_id, "started")
    assert_clock_skewed(started, skewed)
    with fresh.connect() as conn:
        left = conn.execute(
            text(
                "SELECT EXTRACT(EPOCH FROM lease_expires_at - now()) FROM sqla_jobs_job "
                "WHERE id = :id AND state = 'running'"
            ),
            {"id": job_id},
        ).scalar_one()
    # Renewed to now() + lease at most a heartbeat ago.
    assert LEASE - HEARTBEAT - SLACK <= float(left) <= LEASE + 0.1, (
        f"lease ends {float(left):.1f}s from the database's now(), expected about {LEASE:g}s"
    )
    figures.record(skew=skewed.name, lease_s=LEASE, lease_left_s=round(float(left), 2))


@injects("SIGKILL of a worker; the reaping worker's clock skewed by +/-10 min (libfaketime)")
def test_skewed_worker_reaps_a_killed_workers_job_once_its_lease_has_expired(
    skewed: Skewed, fresh: Engine, figures: Figures
) -> None:
    """A SIGKILLed worker's job is reaped by a skewed worker after the lease has expired by the
    database's clock, within one reap interval: not early, not minutes late."""
    victim = skewed.spawn(
        skewed.url,
        "--queues",
        "victim",
        "--lease",
        "2",
        "--heartbeat",
        "0.5",
        "--poll-interval",
        str(POLL),
        env=skewed.env,
    )
    victim.wait_logged("started")
    with Session(fresh) as session:
        job_id = jobs.enqueue(session, Hold(tag="victim", seconds=60), queue="victim").id
        session.commit()
    started = wait_effect(fresh, job_id, "started")
    assert started.pid == victim.proc.pid
    victim.kill()

    def lease_end() -> Any:
        with fresh.connect() as conn:
            return conn.execute(
                text("SELECT lease_expires_at FROM sqla_jobs_job WHERE id = :id"), {"id": job_id}
            ).scalar_one()

    expired_at: datetime = lease_end()
    assert expired_at is not None, "the killed worker's lease is on the job"

    def reaped() -> Any:
        with fresh.connect() as conn:
            return conn.execute(
                text(
                    "SELECT state, crashes, run_at, last_error FROM sqla_jobs_job "
                    "WHERE id = :id AND state <> 'running'"
                ),
                {"id": job_id},
            ).first()

    row = wait_for(reaped, "the expired lease is reaped", timeout=2 + REAP_INTERVAL + 20)
    state, crashes, run_at, last_error = row
    assert (state, crashes) == ("pending", 1)
    assert "stopped heartbeating" in last_error
    # The reaper sets run_at = now(): the moment of the reap, by the database's clock.
    late = seconds(run_at - expired_at)
    assert late >= 0, f"reaped {-late:.1f}s before the lease expired"
    assert late <= REAP_INTERVAL + SLACK, f"reaped {late:.1f}s after the lease expired"
    figures.record(
        skew=skewed.name, reap_interval_s=REAP_INTERVAL, reaped_after_expiry_s=round(late, 3)
    )
