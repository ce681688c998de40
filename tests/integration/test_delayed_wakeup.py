"""Delayed jobs start when due, not at the poll: the enqueue's ``due`` wakeup after the commit, the
worker's timer from its poll probe (on the database's clock), and the traps: a paused queue or a
key at its limit never makes an idle worker spin, and a payload a worker does not know is
ignored."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, Worker
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.enqueue.payloads import HORIZON, parse_due
from sqla_jobs.worker.lanes import Lanes
from tests._waiting import DEADLINE

from ._listening import ARRIVES, QUIET, Heard
from ._workers import running_workers, wait_until

#: The poll interval of these workers: far longer than any wait the tests allow.
POLL = 30.0
#: How late a delayed job may start in a test (a loaded machine); the target is milliseconds.
LATE = 10.0


class Ping(BaseModel):
    n: int = 0


class Keyed(BaseModel):
    key: str = "k"
    hold: bool = False


class Starts:
    """The database clock when each job's handler started, read on a connection of its own."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(libpq_conninfo(url), autocommit=True)
        self._lock = threading.Lock()
        self.at: dict[int, datetime] = {}

    def record(self, job_id: int) -> None:
        with self._lock:
            row = self._conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            self.at[job_id] = row[0]

    def close(self) -> None:
        self._conn.close()


@pytest.fixture
def starts(migrated_url: str) -> Iterator[Starts]:
    found = Starts(migrated_url)
    yield found
    found.close()


def make_jobs(starts: Starts, mode: Any = "after_commit") -> Jobs:
    jobs = Jobs(wakeup=mode)

    @jobs.kind("ping", Ping)
    def ping(args: Ping, ctx: JobContext) -> None:
        starts.record(ctx.job_id)

    return jobs


def enqueue_delayed(engine: Engine, jobs: Jobs, seconds: float, **options: Any) -> tuple[int, Any]:
    """Enqueue a ping ``seconds`` ahead; its id and run_at (the database's)."""
    with Session(engine) as session:
        job = jobs.enqueue(session, Ping(), delay=timedelta(seconds=seconds), **options)
        session.commit()
        return job.id, job.run_at


def listening(worker: Worker) -> bool:
    """Whether ``worker``'s listener is connected (else a NOTIFY now would be missed)."""
    wait_until(lambda: worker.listener is not None, what="the listener started")
    assert worker.listener is not None
    return worker.listener.connected.wait(DEADLINE)


@contextlib.contextmanager
def paused(engine: Engine, queue: str) -> Iterator[None]:
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO sqla_jobs_queue (queue, paused_at) VALUES (:q, now())"), {"q": queue}
        )
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM sqla_jobs_queue WHERE queue = :q"), {"q": queue})


class Calls:
    """How many polls (probes) and claims the workers of a test made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.probes = self.claims = 0
        probe, claim = Lanes.claimable, Lanes.write_and_claim

        async def claimable(lanes: Lanes, *args: Any) -> Any:
            self.probes += 1
            return await probe(lanes, *args)

        async def write_and_claim(lanes: Lanes, *args: Any, **kwargs: Any) -> int:
            self.claims += 1
            return await claim(lanes, *args, **kwargs)

        monkeypatch.setattr(Lanes, "claimable", claimable)
        monkeypatch.setattr(Lanes, "write_and_claim", write_and_claim)

    def during(self, seconds: float) -> tuple[int, int]:
        probes, claims = self.probes, self.claims
        time.sleep(seconds)
        return self.probes - probes, self.claims - claims


def test_a_delayed_job_starts_when_due_not_at_the_poll(
    clean: Engine, migrated_url: str, starts: Starts
) -> None:
    jobs = make_jobs(starts)
    with running_workers(jobs, migrated_url, poll_interval=POLL) as (worker,):
        assert listening(worker)
        job_id, run_at = enqueue_delayed(clean, jobs, 1.0)
        wait_until(lambda: job_id in starts.at, timeout=LATE, what="the delayed job started")
    late = (starts.at[job_id] - run_at).total_seconds()
    assert 0 <= late < LATE, f"started {late:.3f}s after its run_at (database clock)"


def test_a_worker_knows_when_a_job_seen_by_its_poll_is_due_without_a_wakeup(
    clean: Engine, migrated_url: str, starts: Starts
) -> None:
    # Enqueued with no wakeup at all, before the worker starts: its first poll probe finds the
    # job not due yet and sets its timer for the database's run_at.
    jobs = make_jobs(starts, mode="none")
    job_id, run_at = enqueue_delayed(clean, jobs, 2.0)
    with running_workers(jobs, migrated_url, poll_interval=POLL):
        wait_until(lambda: job_id in starts.at, timeout=LATE, what="the delayed job started")
    late = (starts.at[job_id] - run_at).total_seconds()
    assert 0 <= late < LATE, f"started {late:.3f}s after its run_at (database clock)"


def test_the_enqueue_announces_the_earliest_delayed_job_per_queue_after_the_commit(
    clean: Engine, heard: Heard, starts: Starts
) -> None:
    jobs = make_jobs(starts)
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), delay=timedelta(seconds=30))
        jobs.enqueue_many(session, [Ping()] * 3, delay=timedelta(seconds=5))
        jobs.enqueue(session, Ping(), queue="other", delay=timedelta(seconds=20))
        jobs.enqueue(session, Ping(), delay=timedelta(seconds=HORIZON * 2))
        session.flush()
        assert heard.within(QUIET) == []
        session.commit()
    got = sorted(parse_due(p) or (p, -1.0) for p in heard.within(ARRIVES))
    assert [q for q, _ in got] == ["default", "other"]
    assert 0 < got[0][1] <= 5, got
    assert 0 < got[1][1] <= 20, got
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), delay=timedelta(seconds=3))
        session.rollback()
        jobs.enqueue(session, Ping(), delay=timedelta(seconds=HORIZON + 1))
        session.commit()
    assert heard.within(QUIET) == []


@pytest.mark.parametrize("mode", ["in_transaction", "none"])
def test_only_the_after_commit_mode_announces_delayed_jobs(
    clean: Engine, heard: Heard, starts: Starts, mode: str
) -> None:
    jobs = make_jobs(starts, mode)
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), delay=timedelta(seconds=5))
        session.commit()
    assert heard.within(QUIET) == []


def test_a_paused_queue_with_due_and_delayed_jobs_never_makes_a_worker_spin(
    clean: Engine, migrated_url: str, starts: Starts, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = make_jobs(starts)
    calls = Calls(monkeypatch)
    with paused(clean, "default"):
        enqueue_delayed(clean, jobs, 0.0)
        with running_workers(jobs, migrated_url, poll_interval=POLL) as (worker,):
            assert listening(worker)
            time.sleep(QUIET)
            enqueue_delayed(clean, jobs, 0.3)  # announced: one wake at its time, then none
            probes, claims = calls.during(1.5)
        assert probes + claims <= 4, f"{probes} probes and {claims} claims in 1.5 s"
        assert starts.at == {}


def test_a_delayed_job_whose_key_is_at_its_limit_never_makes_a_worker_spin(
    clean: Engine, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = Jobs()
    release = threading.Event()
    started: list[int] = []

    @jobs.kind("keyed", Keyed, concurrency_key=lambda p: p.key, concurrency_limit=1)
    def keyed(args: Keyed, ctx: JobContext) -> None:
        started.append(ctx.job_id)
        if args.hold:
            release.wait(DEADLINE)

    calls = Calls(monkeypatch)
    try:
        with running_workers(jobs, migrated_url, poll_interval=POLL, concurrency=2) as (w,):
            assert listening(w)
            with Session(clean) as session:
                jobs.enqueue(session, Keyed(hold=True))
                session.commit()
            wait_until(lambda: len(started) == 1, what="the holding job started")
            with Session(clean) as session:
                later = jobs.enqueue(session, Keyed(), delay=timedelta(seconds=0.3)).id
                session.commit()
            probes, claims = calls.during(1.5)
            assert probes + claims <= 4, f"{probes} probes and {claims} claims in 1.5 s"
            assert started == [started[0]]
            release.set()
            wait_until(lambda: later in started, what="the delayed keyed job ran")
    finally:
        release.set()
