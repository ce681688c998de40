"""The worker, in process, against a real PostgreSQL: claims, outcomes, leases, wakeups, shutdown.

Each test runs :class:`Worker` in a thread (``run_sync(install_signal_handlers=False)``) through
:func:`running`, which waits for ``worker.started`` and always stops and joins it. Nothing sleeps to
let time pass: tests wait on events with timeouts or poll the database with a deadline, and where a
job must become due again the test moves ``run_at`` to the database's ``now()`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel
from sqlalchemy import Engine, Row, text
from sqlalchemy.orm import Session

from sqla_jobs import Backoff, ConfigurationError, JobContext, Jobs, Worker
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.testing import WorkerSeams
from sqla_jobs.worker import handoff
from sqla_jobs.worker.facade import EXIT_STUCK
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.prefetch import CAP
from tests._waiting import DEADLINE, wait_until
from tests.integration._workers import parked

T = TypeVar("T")

#: A poll interval no test waits out: a job picked up sooner was claimed on a NOTIFY.
QUIET_POLL = 60.0
#: How soon a NOTIFY must bring a job to its handler: a deadline well under ``QUIET_POLL`` (so only
#: the NOTIFY explains the pickup), generous for a loaded machine. Not a latency benchmark.
NOTIFY_WITHIN = 15.0
#: A URL nothing listens on: configuration errors must be raised before any connection is tried.
NOWHERE = "postgresql://nobody@127.0.0.1:1/nothing"
#: The claim statement, as pg_stat_activity shows it (LIKE pattern).
CLAIM_SQL = "WITH claimed AS%"
#: The idle poll's probe (claimable_queues).
PROBE_SQL = "SELECT wanted.queue%"


# -- harness ----------------------------------------------------------------------------------------


class WorkerThread:
    """One in-process worker on its own thread, whose crash (if any) is re-raised on :meth:`stop`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"test-{worker.name}", daemon=True)

    def _main(self) -> None:
        try:
            self.worker.run_sync(install_signal_handlers=False)
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        """Start the thread and wait until the worker says it has started."""
        self.thread.start()
        started = self.worker.started.wait(DEADLINE)
        assert self.error is None, f"worker crashed while starting: {self.error!r}"
        assert started, "worker did not start"

    def stop(self) -> None:
        """Stop the worker gracefully, join its thread, and re-raise anything it crashed with."""
        self.worker.stop()
        self.thread.join(self.worker.config.shutdown_timeout + DEADLINE)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise AssertionError(f"worker crashed: {self.error!r}") from self.error


@contextlib.contextmanager
def running(*workers: Worker) -> Iterator[list[WorkerThread]]:
    """Start ``workers`` in threads, wait for ``started``, and stop and join them all on exit."""
    threads = [WorkerThread(w) for w in workers]
    try:
        for t in threads:
            t.start()
        yield threads
    finally:
        for t in threads:
            t.worker.stop()
        for t in threads:
            if t.thread.ident is not None:
                t.thread.join(t.worker.config.shutdown_timeout + DEADLINE)
    for t in threads:
        t.stop()  # already stopped: only asserts it ended and did not crash


@dataclass(frozen=True)
class Run:
    """One handler call, as the handler saw it."""

    job_id: int
    kind: str
    attempt: int
    crashes: int
    worker: str
    thread: str
    at: float
    args: BaseModel
    ctx: JobContext


class Runs:
    """A thread-safe log of handler calls that tests can wait on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._runs: list[Run] = []

    def record(self, args: BaseModel, ctx: JobContext) -> Run:
        run = Run(
            job_id=ctx.job_id,
            kind=ctx.kind,
            attempt=ctx.attempt,
            crashes=ctx.crashes,
            worker=ctx.worker,
            thread=threading.current_thread().name,
            at=time.monotonic(),
            args=args,
            ctx=ctx,
        )
        with self._cond:
            self._runs.append(run)
            self._cond.notify_all()
        return run

    @property
    def all(self) -> list[Run]:
        with self._cond:
            return list(self._runs)

    def of(self, job_id: int) -> list[Run]:
        return [r for r in self.all if r.job_id == job_id]

    def wait_for(
        self, condition: Callable[[list[Run]], bool], what: str, timeout: float = DEADLINE
    ) -> list[Run]:
        with self._cond:
            if not self._cond.wait_for(lambda: condition(self._runs), timeout):
                raise AssertionError(f"not within {timeout:g}s: {what}; runs: {self._runs!r}")
            return list(self._runs)


def held_kind(name: str) -> tuple[Jobs, Runs, threading.Event]:
    """A ``Jobs`` with one sync kind ``name`` whose handler records its run, then holds its slot
    until the returned event is set (or DEADLINE passes)."""
    jobs = Jobs()
    runs = Runs()
    may_finish = threading.Event()

    @jobs.kind(name, Ping)
    def hold(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)
        may_finish.wait(DEADLINE)

    return jobs, runs, may_finish


class Ping(BaseModel):
    n: int = 0


class Pong(BaseModel):
    n: int = 0


class Typed(BaseModel):
    n: int


# -- database helpers -------------------------------------------------------------------------------


def enqueue(engine: Engine, jobs: Jobs, payloads: Sequence[BaseModel], **options: Any) -> list[int]:
    """Enqueue ``payloads`` in one committed transaction (which NOTIFYs); return their ids."""
    with Session(engine) as session:
        ids = jobs.enqueue_many(session, payloads, **options)
        session.commit()
    return ids


def insert_raw(engine: Engine, kind: str, payload: str, **columns: Any) -> int:
    """Insert a row by hand, bypassing validation and NOTIFY (as another deploy might have)."""
    names = ", ".join(["kind", "payload", *columns])
    values = ", ".join([":kind", "CAST(:payload AS jsonb)", *(f":{c}" for c in columns)])
    with engine.begin() as conn:
        job_id: int = conn.execute(
            text(f"INSERT INTO sqla_jobs_job ({names}) VALUES ({values}) RETURNING id"),
            {"kind": kind, "payload": payload, **columns},
        ).scalar_one()
    return job_id


def job_row(engine: Engine, job_id: int) -> Row[Any] | None:
    """The job's row with ``due_in`` (seconds from the database's clock to run_at). The clock is
    read while the statement runs: now() is the transaction's start, which can precede a write
    the statement's later snapshot sees (due_in would then exceed the delay just written)."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT *, extract(epoch FROM run_at - clock_timestamp())::float AS due_in "
                "FROM sqla_jobs_job WHERE id = :id"
            ),
            {"id": job_id},
        ).first()


def backoff_of(engine: Engine, job_id: int) -> float:
    """Seconds from the job's last failure (its error entry's time) to its ``run_at``: the backoff
    it was given, however late the test reads it."""
    with engine.connect() as conn:
        seconds: float = conn.execute(
            text(
                "SELECT extract(epoch FROM run_at - (errors->-1->>'at')::timestamptz)::float "
                "FROM sqla_jobs_job WHERE id = :id"
            ),
            {"id": job_id},
        ).scalar_one()
    return seconds


def count(engine: Engine, where: str = "true", table: str = "sqla_jobs_job") -> int:
    with engine.connect() as conn:
        n: int = conn.execute(text(f"SELECT count(*) FROM {table} WHERE {where}")).scalar_one()
    return n


def execute(engine: Engine, sql: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params)


def make_due(engine: Engine, job_id: int) -> None:
    """Inject time: the job's retry is due now (instead of waiting out its backoff)."""
    execute(engine, "UPDATE sqla_jobs_job SET run_at = now() WHERE id = :id", id=job_id)


def backend_pids(engine: Engine, query_like: str = "%", role: str = "%") -> list[int]:
    """Backends of this database (other than ours) whose current or last query matches, of the
    worker connections with ``role`` (claim, listen, leases, steps: their application_name)."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND query ILIKE :like "
                    "AND application_name LIKE 'sqla-jobs ' || :role || ' %'"
                ),
                {"like": query_like, "role": role},
            ).scalars()
        )


def terminate(engine: Engine, pid: int) -> None:
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()


# -- many workers ------------------------------------------------------------------------------------


def test_three_workers_run_each_of_3000_jobs_exactly_once(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()
    lock = threading.Lock()
    executions: Counter[int] = Counter()
    by_worker: Counter[str] = Counter()
    # The first jobs wait until every worker has started one: two workers that wake first could
    # otherwise drain all 3000 in big claims before a third, slower on a loaded machine, claims
    # at all. Until a job ends a worker holds only as many jobs as it has slots, so the others
    # are left for the third.
    all_in = threading.Event()

    def note(ctx: JobContext) -> None:
        with lock:
            executions[ctx.job_id] += 1
            by_worker[ctx.worker] += 1
            if len(by_worker) == 3:
                all_in.set()

    @jobs.kind("async_job", Ping)
    async def async_job(args: Ping, ctx: JobContext) -> None:
        note(ctx)
        deadline = time.monotonic() + DEADLINE
        while not all_in.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    @jobs.kind("sync_job", Pong)
    def sync_job(args: Pong, ctx: JobContext) -> None:
        note(ctx)
        all_in.wait(DEADLINE)

    workers = [
        Worker(jobs, migrated_url, concurrency=4, poll_interval=0.2, name=f"w{i}") for i in range(3)
    ]
    with running(*workers):
        payloads: list[BaseModel] = [Ping(n=i) if i % 2 else Pong(n=i) for i in range(3000)]
        ids = enqueue(clean, jobs, payloads)
        wait_until(lambda: count(clean) == 0, "all 3000 jobs done", timeout=60)
    assert set(executions) == set(ids)
    assert max(executions.values()) == 1, "a job ran more than once"
    # Every claim ran its job, or gave it back unstarted: a loaded machine can stall a worker
    # past BUFFER_MAX_WAIT with jobs in its buffer (CI saw 878), and others claim them again.
    released = sum(w.counts["released"] for w in workers)
    assert sum(w.counts["claimed"] for w in workers) == 3000 + released
    assert sum(w.counts["done"] for w in workers) == 3000
    assert all(by_worker[w.name] > 0 for w in workers), f"a worker got no jobs: {by_worker}"
    assert count(clean, table="sqla_jobs_history") == 0


# -- handlers ---------------------------------------------------------------------------------------


def test_sync_handlers_run_in_the_pool_and_async_ones_on_the_loop(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    runs = Runs()

    @jobs.kind("sync_kind", Ping)
    def sync_kind(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)

    @jobs.kind("async_kind", Pong)
    async def async_kind(args: Pong, ctx: JobContext) -> None:
        runs.record(args, ctx)

    worker = Worker(jobs, migrated_url, poll_interval=0.2)
    with running(worker) as (wt,):
        sync_id, async_id = enqueue(clean, jobs, [Ping(n=7), Pong(n=8)])
        runs.wait_for(lambda rs: len(rs) == 2, "both handlers ran")
        wait_until(lambda: count(clean) == 0, "both jobs completed")
    (sync_run,) = runs.of(sync_id)
    (async_run,) = runs.of(async_id)
    assert sync_run.args == Ping(n=7)
    assert async_run.args == Pong(n=8)
    assert sync_run.thread.startswith("sqla-jobs-handler")
    assert async_run.thread == wt.thread.name
    assert (sync_run.attempt, sync_run.crashes, sync_run.worker) == (1, 0, worker.name)
    assert worker.counts["done"] == 2


def test_ctx_created_at_is_the_rows_created_at_to_the_microsecond(
    clean: Engine, migrated_url: str
) -> None:
    # The claim returns created_at as integer microseconds; the context builds the datetime.
    jobs = Jobs()
    seen: dict[int, object] = {}

    @jobs.kind("stamped", Ping)
    async def stamped(args: Ping, ctx: JobContext) -> None:
        seen[ctx.job_id] = ctx.created_at

    with Session(clean) as session, session.begin():
        # A created_at with every microsecond digit set, far from the epoch's float rounding.
        session.execute(text("SET LOCAL TIME ZONE 'Asia/Kolkata'"))
        ids = jobs.enqueue_many(session, [Ping(n=1), Ping(n=2)])
        session.execute(
            text(
                "UPDATE sqla_jobs_job SET created_at = '2026-12-06 11:15:41.987654+05:30' "
                "WHERE id = :id"
            ),
            {"id": ids[0]},
        )
    with clean.connect() as conn:
        stored = dict(conn.execute(text("SELECT id, created_at FROM sqla_jobs_job")).all())
    with running(Worker(jobs, migrated_url, poll_interval=0.2)):
        wait_until(lambda: len(seen) == 2, "both jobs ran")
    assert seen == stored
    assert str(seen[ids[0]]) == "2026-12-06 05:45:41.987654+00:00"


def test_a_worker_in_an_applications_process_leaves_its_garbage_collector_alone(
    clean: Engine, migrated_url: str
) -> None:
    # Only `sqla-jobs worker` freezes its heap and raises the collector's threshold
    # (sqla_jobs.worker.heap): in an application's own process a frozen object could never be
    # collected once it ends up in a cycle, and the thresholds are the application's.
    import gc

    jobs = Jobs()
    ran = threading.Event()

    @jobs.kind("plain", Ping)
    async def plain(args: Ping, ctx: JobContext) -> None:
        ran.set()

    before = gc.get_freeze_count(), gc.get_threshold()
    with running(Worker(jobs, migrated_url, poll_interval=0.2)):
        enqueue(clean, jobs, [Ping()])
        assert ran.wait(DEADLINE)
    assert (gc.get_freeze_count(), gc.get_threshold()) == before


def test_an_async_handler_past_its_timeout_is_cancelled_and_failed_as_timed_out(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    cancelled = threading.Event()

    @jobs.kind("hang_async", Ping, timeout=0.2, max_attempts=1)
    async def hang_async(args: Ping, ctx: JobContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    worker = Worker(jobs, migrated_url, poll_interval=0.2)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Ping()])
        wait_until(lambda: worker.counts["dead"] == 1, "the timeout recorded")
    assert cancelled.is_set(), "the async handler was not cancelled"
    row = job_row(clean, job_id)
    assert row is not None
    assert (row.state, row.attempts, row.lease_token) == ("dead", 1, None)
    assert row.last_error == "timed out after 0.2s"


def test_a_sync_handler_past_its_timeout_keeps_its_job_running_until_it_returns_then_fails(
    clean: Engine, migrated_url: str
) -> None:
    """A thread cannot be stopped: its job stays running (lease renewed) so that no retry can
    overlap it, and fails as timed out once the handler returns; ctx.deadline told it when."""
    jobs = Jobs()
    release = threading.Event()
    deadlines: list[float | None] = []

    # A retry backed off far past the test's end: its row is read after the worker has stopped,
    # however long that takes on a loaded machine.
    @jobs.kind("hang_sync", Pong, timeout=0.2, backoff=Backoff(base=600))
    def hang_sync(args: Pong, ctx: JobContext) -> None:
        deadlines.append(ctx.time_left())
        release.wait(DEADLINE)

    # A long lease, renewed every 0.5 s: a starved heartbeat on a loaded machine cannot let it
    # lapse (the reaper would then take the job back) before the test reads it.
    worker = Worker(jobs, migrated_url, poll_interval=0.2, lease=30, heartbeat=0.5)
    try:
        with running(worker):
            (job_id,) = enqueue(clean, jobs, [Pong()])
            wait_until(lambda: deadlines != [], "the handler started")
            first = job_row(clean, job_id)
            assert first is not None

            def renewed() -> bool:
                now = job_row(clean, job_id)
                return now is not None and now.lease_expires_at > first.lease_expires_at

            # A heartbeat (every 0.5 s) after the 0.2 s timeout: the lease is kept, not dropped.
            wait_until(renewed, "the lease renewed past the timeout")
            row = job_row(clean, job_id)
            assert row is not None
            assert (row.state, row.attempts) == ("running", 1), "released or failed too early"
            assert worker.counts["failed"] == 0
            release.set()
            wait_until(lambda: worker.counts["failed"] == 1, "the timeout recorded")
    finally:
        release.set()
    row = job_row(clean, job_id)
    assert row is not None
    assert (row.state, row.attempts, row.lease_token) == ("pending", 1, None)
    assert row.last_error.startswith("timed out after 0.2s (the sync handler returned ")
    assert row.due_in > 0, "a timeout is a failure: the retry is backed off"
    (left,) = deadlines
    # The deadline runs from the claim, so a handler thread started late on a loaded machine may
    # find it already past: only that it is set, and never later than the timeout, is asserted.
    assert left is not None
    assert left <= 0.2


def test_a_sync_handler_stuck_past_its_grace_stops_the_worker_with_exit_5_and_keeps_its_job(
    clean: Engine, migrated_url: str
) -> None:
    """A hard time limit: the worker stops claiming and exits for a restart; the stuck job is
    not given back (its thread may still act), so it is reaped once the lease runs out."""
    jobs = Jobs()
    release = threading.Event()

    @jobs.kind("stuck_sync", Pong, timeout=0.1)
    def stuck_sync(args: Pong, ctx: JobContext) -> None:
        release.wait(DEADLINE)

    worker = Worker(jobs, migrated_url, poll_interval=0.2, stuck_grace=0.3, shutdown_timeout=0.2)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(worker.run_sync(install_signal_handlers=False)), daemon=True
    )
    thread.start()
    try:
        assert worker.started.wait(DEADLINE)
        (job_id,) = enqueue(clean, jobs, [Pong()])
        thread.join(DEADLINE)
        assert codes == [EXIT_STUCK]
        row = job_row(clean, job_id)
        assert row is not None
        assert (row.state, row.attempts, row.interruptions) == ("running", 1, 0)
        assert worker.counts["released"] == 0
    finally:
        release.set()
        worker.stop()
        thread.join(DEADLINE)


# -- failures and backoff ---------------------------------------------------------------------------


def test_failures_back_off_on_the_database_clock_until_dead(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    backoff = Backoff(base=2, cap_seconds=5, jitter=0)

    @jobs.kind("flaky", Ping, backoff=backoff, max_attempts=4)
    def flaky(args: Ping, ctx: JobContext) -> None:
        raise RuntimeError(f"attempt {ctx.attempt} failed")

    worker = Worker(jobs, migrated_url, poll_interval=0.2)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Ping()])
        for failures in (1, 2, 3):
            row = wait_until(
                lambda n=failures: (
                    (r := job_row(clean, job_id)) is not None
                    and r.state == "pending"
                    and r.attempts == n
                    and r
                ),
                f"failure {failures} recorded",
            )
            expected = backoff.delay(failures)
            assert backoff_of(clean, job_id) == pytest.approx(expected, abs=0.01), failures
            assert row.last_error.startswith(f"RuntimeError: attempt {failures} failed")
            assert (row.crashes, row.lease_token, row.locked_by) == (0, None, None)
            make_due(clean, job_id)
        dead = wait_until(
            lambda: (r := job_row(clean, job_id)) is not None and r.state == "dead" and r,
            "dead after max_attempts",
        )
    assert dead.attempts == 4
    assert dead.last_error.startswith("RuntimeError: attempt 4 failed")
    assert (worker.counts["failed"], worker.counts["dead"], worker.counts["done"]) == (3, 1, 0)
    assert [backoff.delay(n) for n in (1, 2, 3)] == [2, 4, 5], "the schedule under test is capped"


def test_a_huge_exception_message_is_kept_as_its_first_500_characters(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()

    @jobs.kind("loud", Ping)
    def loud(args: Ping, ctx: JobContext) -> None:
        raise ValueError("x" * 100_000)

    worker = Worker(jobs, migrated_url, poll_interval=0.2)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Ping()])
        row = wait_until(
            lambda: (r := job_row(clean, job_id)) is not None and r.last_error and r,
            "failure recorded",
        )
    assert row.state == "pending"
    assert len(row.last_error) == 500
    assert row.last_error.startswith("ValueError: xxxx")


def test_unknown_kind_is_failed_with_backoff_and_the_worker_keeps_going(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    runs = Runs()

    @jobs.kind("known", Ping)
    def known(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)

    unknown_id = insert_raw(clean, "vanished", "{}")
    worker = Worker(jobs, migrated_url, poll_interval=0.2)
    with running(worker):
        row = wait_until(
            lambda: (r := job_row(clean, unknown_id)) is not None and r.last_error and r,
            "the unknown kind's failure recorded",
        )
        (known_id,) = enqueue(clean, jobs, [Ping(n=1)])
        runs.wait_for(lambda rs: [r.job_id for r in rs] == [known_id], "the known job ran")
        wait_until(lambda: job_row(clean, known_id) is None, "the known job completed")
    assert (row.state, row.attempts, row.crashes, row.lease_token) == ("pending", 1, 0, None)
    assert "unknown kind 'vanished'" in row.last_error
    assert backoff_of(clean, unknown_id) == pytest.approx(2.0, abs=0.01), (
        "not the default backoff (2 s after one failure)"
    )
    assert (worker.counts["failed"], worker.counts["done"]) == (1, 1)


def test_payload_that_no_longer_validates_is_dead_at_once(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()
    runs = Runs()

    @jobs.kind("typed", Typed, max_attempts=10)
    def typed(args: Typed, ctx: JobContext) -> None:
        runs.record(args, ctx)

    job_id = insert_raw(clean, "typed", '{"n": "not a number"}')
    worker = Worker(jobs, migrated_url, poll_interval=0.2)
    with running(worker):
        row = wait_until(
            lambda: (r := job_row(clean, job_id)) is not None and r.state == "dead" and r,
            "the job is dead",
        )
    assert row.attempts == 1
    assert "payload no longer validates against Typed" in row.last_error
    assert "valid integer" in row.last_error
    assert runs.all == [], "the handler never sees an invalid payload"
    assert (worker.counts["dead"], worker.counts["failed"]) == (1, 0)


# -- leases -----------------------------------------------------------------------------------------


def test_a_worker_that_lost_its_lease_cannot_complete_the_job_another_worker_reclaimed(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    runs = Runs()
    first_may_finish = threading.Event()
    second_may_finish = threading.Event()

    @jobs.kind("hold", Ping)
    def hold(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)
        (first_may_finish if ctx.crashes == 0 else second_may_finish).wait(DEADLINE)

    options: dict[str, Any] = {
        "concurrency": 1,
        "lease": 1.5,
        "heartbeat": 0.5,
        "poll_interval": 0.2,
    }
    paused = threading.Event()
    a = Worker(
        jobs, migrated_url, name="frozen-a", seams=WorkerSeams(heartbeats_paused=paused), **options
    )
    b = Worker(jobs, migrated_url, name="rescuer-b", keep_history=True, **options)
    try:
        with running(a) as (a_thread,):
            paused.set()  # A stops heartbeating, as a stalled process would
            (job_id,) = enqueue(clean, jobs, [Ping()])
            (first,) = runs.wait_for(lambda rs: len(rs) == 1, "A runs the job")
            assert first.worker == a.name
            with running(b):
                runs.wait_for(lambda rs: len(rs) == 2, "B reclaims the expired job and runs it")
                held = job_row(clean, job_id)
                assert held is not None
                assert (held.state, held.locked_by, held.attempts, held.crashes) == (
                    "running",
                    b.name,
                    2,
                    1,
                )
                assert held.last_error.startswith("lease expired: worker frozen-a")
                # A beats again, learns the lease is gone and tells its handler.
                paused.clear()
                assert first.ctx.lease_lost.wait(DEADLINE), "A's handler was not told"
                first_may_finish.set()
                a_thread.stop()  # flushes A's outcome: a completion under the old token
                after = job_row(clean, job_id)
                assert after is not None, "A's stale completion deleted B's job"
                assert (after.state, after.locked_by, after.lease_token) == (
                    "running",
                    b.name,
                    held.lease_token,
                )
                second_may_finish.set()
                wait_until(lambda: job_row(clean, job_id) is None, "B completes the job")
    finally:
        first_may_finish.set()
        second_may_finish.set()
    with clean.connect() as conn:
        history = conn.execute(text("SELECT id, attempts, crashes FROM sqla_jobs_history")).all()
    assert [tuple(h) for h in history] == [(job_id, 2, 1)], "the row reflects B's run only"
    assert [(r.worker, r.attempt, r.crashes) for r in runs.all] == [(a.name, 1, 0), (b.name, 2, 1)]


def test_a_completion_rejected_by_the_lease_fence_is_not_counted_as_done(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs, may_finish = held_kind("hold")

    paused = threading.Event()
    paused.set()
    worker = Worker(
        jobs,
        migrated_url,
        concurrency=1,
        poll_interval=0.2,
        seams=WorkerSeams(heartbeats_paused=paused),
    )
    try:
        with running(worker) as (wt,):
            (job_id,) = enqueue(clean, jobs, [Ping()])
            runs.wait_for(lambda rs: len(rs) == 1, "the handler runs")
            # Another worker takes the job over: its lease expired, was reaped and reclaimed.
            execute(
                clean,
                "UPDATE sqla_jobs_job SET lease_token = gen_random_uuid(), locked_by = 'other', "
                "crashes = crashes + 1 WHERE id = :id",
                id=job_id,
            )
            may_finish.set()
            wt.stop()
    finally:
        may_finish.set()
    row = job_row(clean, job_id)
    assert row is not None
    assert row.locked_by == "other", "the fence kept the other owner's job"
    assert worker.counts["done"] == 0


# -- graceful stop ----------------------------------------------------------------------------------


def test_no_more_than_concurrency_handlers_run_at_once_whether_or_not_they_await(
    clean: Engine, migrated_url: str
) -> None:
    """Slots run buffered jobs one after another: half these handlers never await, which must
    neither let more than ``concurrency`` run at once nor stall the others."""
    jobs = Jobs()
    in_flight = peak = 0
    done: list[int] = []

    @jobs.kind("work", Ping)
    async def work(args: Ping, ctx: JobContext) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if args.n % 2:
            await asyncio.sleep(0.001)
        in_flight -= 1
        done.append(args.n)

    with running(Worker(jobs, migrated_url, concurrency=3, poll_interval=0.2)):
        enqueue(clean, jobs, [Ping(n=i) for i in range(600)])
        wait_until(lambda: len(done) == 600 and count(clean) == 0, "all 600 jobs done")
    assert peak == 3
    assert sorted(done) == list(range(600))


def test_stop_lets_running_handlers_finish_and_claims_nothing_more(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs, may_finish = held_kind("work")

    worker = Worker(jobs, migrated_url, concurrency=4, poll_interval=0.2)
    wt = WorkerThread(worker)
    try:
        wt.start()
        enqueue(clean, jobs, [Ping(n=i) for i in range(6)])
        runs.wait_for(lambda rs: len(rs) == 4, "four handlers running")
        worker.stop()
        assert wt.thread.is_alive(), "the worker must wait for its running handlers"
        may_finish.set()
        wt.stop()
    finally:
        may_finish.set()
        worker.stop()
    # Jobs prefetched beyond the four slots were given back at stop, never started.
    assert worker.counts["claimed"] - worker.counts["released"] == 4
    assert worker.counts["done"] == 4
    assert count(clean, "state = 'running'") == 0
    with clean.connect() as conn:
        left = conn.execute(text("SELECT state, attempts FROM sqla_jobs_job")).all()
    assert sorted(tuple(r) for r in left) == [("pending", 0), ("pending", 0)]


def test_prefetched_jobs_that_cannot_start_within_a_second_go_back_to_the_queue(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs, may_finish = held_kind("work")

    worker = Worker(jobs, migrated_url, concurrency=1, prefetch=5, poll_interval=0.2)
    try:
        with running(worker):
            enqueue(clean, jobs, [Ping(n=i) for i in range(6)])
            runs.wait_for(lambda rs: len(rs) == 1, "the one slot busy")
            # The other five were claimed with it; stuck behind the busy slot, they go back.
            wait_until(lambda: worker.counts["released"] == 5, "the prefetched five given back")
            with clean.connect() as conn:
                left = conn.execute(
                    text("SELECT state, attempts FROM sqla_jobs_job WHERE state <> 'running'")
                ).all()
            assert sorted(tuple(r) for r in left) == [("pending", 0)] * 5
            assert count(clean, "state = 'running'") == 1
            may_finish.set()
            wait_until(lambda: count(clean) == 0, "all six done once the slot is free")
    finally:
        may_finish.set()
    assert worker.counts["done"] == 6
    assert len(runs.all) == 6


@pytest.mark.parametrize("style", ["async", "sync"])
def test_a_handler_still_running_at_the_shutdown_timeout_is_released_not_failed(
    clean: Engine, migrated_url: str, style: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqla_jobs.worker")
    jobs = Jobs()
    runs = Runs()
    unblock = threading.Event()

    if style == "async":

        @jobs.kind("stuck", Ping)
        async def stuck_async(args: Ping, ctx: JobContext) -> None:
            runs.record(args, ctx)
            await asyncio.Event().wait()

    else:

        @jobs.kind("stuck", Ping)
        def stuck_sync(args: Ping, ctx: JobContext) -> None:
            runs.record(args, ctx)
            unblock.wait(DEADLINE)

    worker = Worker(jobs, migrated_url, shutdown_timeout=0.5, poll_interval=0.2)
    try:
        with running(worker):
            (job_id,) = enqueue(clean, jobs, [Ping()])
            runs.wait_for(lambda rs: len(rs) == 1, "the handler is running")
        row = job_row(clean, job_id)
        assert row is not None, "the unfinished job was deleted as if it had completed"
        assert (row.state, row.attempts, row.crashes) == ("pending", 0, 0)
        assert (row.lease_token, row.lease_expires_at, row.locked_by) == (None, None, None)
        assert row.last_error is None, "a release is not a failure"
        assert worker.counts["released"] == 1
        assert (worker.counts["done"], worker.counts["failed"]) == (0, 0)
        # The operator is told which job went back, and which thread was left running.
        released = [r for r in caplog.records if getattr(r, "event", None) == "released"]
        assert [(r.levelname, r.getMessage()) for r in released] == [
            (
                "WARNING",
                f"released 1 interrupted job back to the queue (its handler had started): {job_id}",
            )
        ]
        abandoned = [r for r in caplog.records if getattr(r, "event", None) == "abandoned"]
        if style == "sync":
            (line,) = [(r.levelname, r.getMessage()) for r in abandoned]
            assert line[0] == "WARNING"
            assert re.fullmatch(
                r"left 1 sync handler thread running at exit \(Python cannot stop a thread\): "
                rf"sqla-jobs-handler-\d+ \(job {job_id}\)",
                line[1],
            ), line
        else:
            assert abandoned == []
        (stopped,) = [r for r in caplog.records if getattr(r, "event", None) == "stopped"]
        assert stopped.getMessage().endswith(
            "stopped: claimed=1 done=0 failed=0 dead=0 released=1 snoozed=0 cancelled=0"
        ), stopped.getMessage()
    finally:
        unblock.set()


# -- wakeups: LISTEN/NOTIFY and polling -------------------------------------------------------------


def _listener_pid(engine: Engine) -> int:
    pids = backend_pids(engine, role="listen")
    assert len(pids) == 1, f"expected one LISTEN connection, found {pids}"
    return pids[0]


def _pickup_latency(
    engine: Engine, jobs: Jobs, runs: Runs, n: int, timeout: float = DEADLINE
) -> float:
    """Enqueue one job and return the seconds from before its commit to its handler's start."""
    before = time.monotonic()
    (job_id,) = enqueue(engine, jobs, [Ping(n=n)])
    runs.wait_for(lambda rs: any(r.job_id == job_id for r in rs), f"job {n} picked up", timeout)
    (run,) = runs.of(job_id)
    return run.at - before


def _settle(engine: Engine, jobs: Jobs, runs: Runs, n: int) -> None:
    """Run one job to completion, so that the start-up (or reconnect) wakeups are spent and the
    worker is idle on its poll timer. Allows for the quiet poll: a NOTIFY can be lost to the race
    that test_a_notify_that_arrives_while_a_claim_is_in_flight_is_not_lost documents."""
    _pickup_latency(engine, jobs, runs, n, timeout=QUIET_POLL + DEADLINE)
    wait_until(lambda: count(engine) == 0, "the settling job completed")


def test_notify_wakes_an_idle_worker_and_survives_a_killed_listen_connection(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    runs = Runs()

    @jobs.kind("ping", Ping)
    async def ping(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)

    # Polling every QUIET_POLL: a pickup within NOTIFY_WITHIN can only come from the NOTIFY.
    worker = Worker(jobs, migrated_url, listen=True, poll_interval=QUIET_POLL)
    with running(worker):
        listener = worker.listener
        assert listener is not None
        wait_until(lambda: listener.connects == 1, "listener connected")
        _settle(clean, jobs, runs, 0)
        assert _pickup_latency(clean, jobs, runs, 1) < NOTIFY_WITHIN

        terminate(clean, _listener_pid(clean))
        wait_until(lambda: listener.connects == 2, "listener reconnected")
        assert listener.connected.is_set()
        _settle(clean, jobs, runs, 2)
        assert _pickup_latency(clean, jobs, runs, 3) < NOTIFY_WITHIN, "latency did not recover"
        wait_until(lambda: count(clean) == 0, "all jobs completed")
    assert worker.counts["done"] == 4


def test_polling_delivers_jobs_while_the_listen_connection_cannot_come_back(
    clean: Engine, migrated_url: str, server_url: str
) -> None:
    jobs = Jobs()
    runs = Runs()

    @jobs.kind("ping", Ping)
    async def ping(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)

    worker = Worker(jobs, migrated_url, listen=True, poll_interval=0.5)
    # Refusing new connections to the database (superusers included) keeps the listener out,
    # while the connections already open, the worker's and this test's, stay up.
    inside = psycopg.connect(libpq_conninfo(migrated_url), autocommit=True)
    outside = psycopg.connect(libpq_conninfo(server_url), autocommit=True)
    database = sql.Identifier(inside.info.dbname)
    try:
        with running(worker):
            listener = worker.listener
            assert listener is not None
            wait_until(lambda: listener.connects == 1, "listener connected")
            pid = _listener_pid(clean)
            outside.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(database))
            inside.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_until(lambda: not listener.connected.is_set(), "listener lost")
            # Inserted without NOTIFY, and nobody listens anyway: only the poll can find it.
            inserted = inside.execute(
                "INSERT INTO sqla_jobs_job (kind, payload) VALUES ('ping', '{}') RETURNING id"
            ).fetchone()
            assert inserted is not None
            runs.wait_for(lambda rs: [r.job_id for r in rs] == [inserted[0]], "the poll ran it")
            assert listener.connects == 1, "the listener got back in: this would prove nothing"
            outside.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(database))
            wait_until(lambda: listener.connects == 2, "listener reconnected once it could")
    finally:
        outside.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(database))
        outside.close()
        inside.close()
    wait_until(lambda: count(clean) == 0, "job completed")


def test_poll_only_worker_runs_jobs_without_a_listen_connection(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    runs = Runs()

    @jobs.kind("ping", Ping)
    async def ping(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)

    worker = Worker(jobs, migrated_url, listen=False, poll_interval=0.2)
    with running(worker):
        ids = enqueue(clean, jobs, [Ping(n=i) for i in range(10)])
        wait_until(lambda: count(clean) == 0, "all jobs completed")
        assert backend_pids(clean, "LISTEN %") == []
        assert backend_pids(clean, role="listen") == []
    assert worker.listener is None
    assert sorted(r.job_id for r in runs.all) == sorted(ids)


#: The advisory lock the test trigger waits on (single-key: cannot collide with sqla-jobs' own).
GATE_LOCK = 4242


def gate_waiters(engine: Engine) -> list[str]:
    """The worker connections (their role: claim, listen, ...) waiting for the test's gate lock."""
    with engine.connect() as conn:
        names = conn.execute(
            text(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                "WHERE a.datname = current_database() "
                f"AND l.locktype = 'advisory' AND NOT l.granted AND l.objid = {GATE_LOCK} "
                "AND l.objsubid = 1"
            )
        ).scalars()
        return [name.split()[1] for name in names]


@contextlib.contextmanager
def gated_claims(engine: Engine, kind: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A test-only trigger holds every claim of a ``kind`` job mid-statement, on an advisory lock
    that the yielded connection holds until it unlocks it (or closes)."""
    execute(
        engine,
        f"""
        CREATE OR REPLACE FUNCTION sqla_jobs_test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock({GATE_LOCK}); RETURN NEW; END $$
        """,
    )
    execute(
        engine,
        "CREATE TRIGGER sqla_jobs_test_gate BEFORE UPDATE ON sqla_jobs_job FOR EACH ROW "
        f"WHEN (OLD.kind = '{kind}' AND NEW.state = 'running') "
        "EXECUTE FUNCTION sqla_jobs_test_gate()",
    )
    url = engine.url.render_as_string(hide_password=False)
    try:
        with psycopg.connect(libpq_conninfo(url), autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (GATE_LOCK,))
            yield holder
    finally:
        execute(engine, "DROP TRIGGER IF EXISTS sqla_jobs_test_gate ON sqla_jobs_job")
        execute(engine, "DROP FUNCTION IF EXISTS sqla_jobs_test_gate()")


def open_gate(holder: psycopg.Connection[tuple[object, ...]]) -> None:
    holder.execute("SELECT pg_advisory_unlock(%s)", (GATE_LOCK,))


def _gate_and_ping(jobs: Jobs, runs: Runs) -> None:
    """Register a ``gate`` (Ping) and a ``ping`` (Pong) kind whose handlers record their runs."""

    @jobs.kind("gate", Ping)
    async def gate(args: Ping, ctx: JobContext) -> None:
        runs.record(args, ctx)

    @jobs.kind("ping", Pong)
    async def ping(args: Pong, ctx: JobContext) -> None:
        runs.record(args, ctx)


def test_a_notify_that_arrives_while_a_claim_is_in_flight_is_not_lost(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = Jobs(), Runs()
    _gate_and_ping(jobs, runs)
    # The claim of the 'gate' job is held mid-statement, so that a NOTIFY is delivered while that
    # claim is in flight.
    with gated_claims(clean, "gate") as holder:
        gate_id = insert_raw(clean, "gate", "{}")
        worker = Worker(jobs, migrated_url, listen=True, poll_interval=QUIET_POLL)
        with running(worker):
            wait_until(
                lambda: gate_waiters(clean) == ["claim"],
                "the gate job's claim waits in the trigger",
            )
            listener = worker.listener
            assert listener is not None
            wait_until(lambda: listener.connects == 1, "listener connected")
            wakeups = worker.wakeups
            assert wakeups is not None
            before = wakeups.count
            (ping_id,) = enqueue(clean, jobs, [Pong()])
            wait_until(lambda: wakeups.count > before, "the NOTIFY reaches the worker")
            open_gate(holder)
            runs.wait_for(lambda rs: any(r.job_id == gate_id for r in rs), "the gate job ran")
            runs.wait_for(
                lambda rs: any(r.job_id == ping_id for r in rs),
                "the job announced during the claim ran without waiting for the poll",
                timeout=NOTIFY_WITHIN,
            )


def _idle_listening_worker(jobs: Jobs, url: str, runs: Runs) -> Worker:
    """A worker that only a NOTIFY can wake in time (QUIET_POLL), for :func:`_gate_and_ping`'s
    kinds."""
    _gate_and_ping(jobs, runs)
    return Worker(jobs, url, listen=True, poll_interval=QUIET_POLL)


def test_an_idle_worker_claims_on_its_listen_connection_when_notified(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = Jobs(), Runs()
    worker = _idle_listening_worker(jobs, migrated_url, runs)
    with running(worker):
        wait_until(parked(worker), "the worker is idle")
        (job_id,) = enqueue(clean, jobs, [Pong()])
        runs.wait_for(
            lambda rs: [r.job_id for r in rs] == [job_id], "the job ran", timeout=NOTIFY_WITHIN
        )
        # Completed first: until its completion is written, the claim connection's last query is
        # still the claim it made at start, before it parked.
        wait_until(lambda: count(clean) == 0, "the job completed")
        # The claim ran on the LISTEN connection, in the listener's thread: no hop through the
        # event loop between the notification and the claim.
        assert len(backend_pids(clean, CLAIM_SQL, "listen")) == 1
        assert backend_pids(clean, CLAIM_SQL, "claim") == []
        wait_until(parked(worker), "the worker is idle again")
        (second,) = enqueue(clean, jobs, [Pong()])
        runs.wait_for(lambda rs: len(rs) == 2, "the second job ran", timeout=NOTIFY_WITHIN)
    assert worker.counts["claimed"] == worker.counts["done"] == 2
    assert [r.attempt for r in runs.of(second)] == [1]


def test_a_stop_while_the_listener_claims_gives_the_claimed_job_back(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = Jobs(), Runs()
    worker = _idle_listening_worker(jobs, migrated_url, runs)
    with gated_claims(clean, "gate") as holder, running(worker) as (thread,):
        wait_until(parked(worker), "the worker is idle")
        (job_id,) = enqueue(clean, jobs, [Ping()])
        wait_until(lambda: gate_waiters(clean) == ["listen"], "the listener's claim is held")
        worker.stop()
        # A window for what must not happen (the worker exiting while its listener's claim is
        # held), long enough for the fetch loop to be out on a loaded machine.
        time.sleep(1.0)
        assert thread.thread.is_alive()
        open_gate(holder)
        thread.stop()
    assert runs.all == []
    row = job_row(clean, job_id)
    assert row is not None
    # Back in the queue, its attempt undone: not left running until its lease expires.
    assert (row.state, row.attempts, row.lease_token) == ("pending", 0, None)
    assert worker.counts["released"] == 1


def test_the_listeners_claim_wakes_the_event_loop_before_its_rows_arrive(
    clean: Engine, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle worker's listener wakes the event loop's thread as its claim starts: the rows it
    then delivers find that thread awake (the last hop of a pickup)."""
    woken: list[threading.Thread] = []
    monkeypatch.setattr(handoff, "_awake", lambda: woken.append(threading.current_thread()))
    jobs, runs = Jobs(), Runs()
    worker = _idle_listening_worker(jobs, migrated_url, runs)
    with gated_claims(clean, "gate") as holder, running(worker):
        wait_until(parked(worker), "the worker is idle")
        (job_id,) = enqueue(clean, jobs, [Ping()])
        wait_until(lambda: gate_waiters(clean) == ["listen"], "the listener's claim is held")
        wait_until(lambda: bool(woken), "the event loop woken while the claim is held")
        assert woken[0] is not worker.listener, "woken on the listener's thread, not the loop's"
        open_gate(holder)
        runs.wait_for(lambda rs: [r.job_id for r in rs] == [job_id], "the job ran")
    assert len(woken) == 1


def test_the_listeners_claim_runs_with_a_generic_plan(clean: Engine, migrated_url: str) -> None:
    """The claim an idle worker's listener makes keeps its generic plan once prepared: the server
    does not plan it again at every pickup. A test-only trigger records the settings each claim
    runs under, and on which connection."""
    execute(clean, "CREATE TABLE sqla_jobs_test_claims (app text, plan_mode text, sync text)")
    execute(
        clean,
        """
        CREATE FUNCTION sqla_jobs_test_record() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO sqla_jobs_test_claims VALUES (current_setting('application_name'),
                current_setting('plan_cache_mode'), current_setting('synchronous_commit'));
            RETURN NEW;
        END $$
        """,
    )
    execute(
        clean,
        "CREATE TRIGGER sqla_jobs_test_record BEFORE UPDATE ON sqla_jobs_job FOR EACH ROW "
        "WHEN (NEW.state = 'running' AND OLD.state = 'pending') "
        "EXECUTE FUNCTION sqla_jobs_test_record()",
    )
    jobs, runs = Jobs(), Runs()
    worker = _idle_listening_worker(jobs, migrated_url, runs)
    try:
        with running(worker):
            wait_until(parked(worker), "the worker is idle")
            (job_id,) = enqueue(clean, jobs, [Pong()])
            runs.wait_for(lambda rs: [r.job_id for r in rs] == [job_id], "the job ran")
        with clean.connect() as conn:
            claims = conn.exec_driver_sql("SELECT * FROM sqla_jobs_test_claims").all()
    finally:
        execute(clean, "DROP TRIGGER IF EXISTS sqla_jobs_test_record ON sqla_jobs_job")
        execute(clean, "DROP FUNCTION IF EXISTS sqla_jobs_test_record()")
        execute(clean, "DROP TABLE IF EXISTS sqla_jobs_test_claims")
    listener = [(plan, sync) for app, plan, sync in claims if app.startswith("sqla-jobs listen ")]
    assert listener == [("force_generic_plan", "off")], claims


def test_a_listen_connection_killed_mid_claim_loses_no_job(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = Jobs(), Runs()
    worker = _idle_listening_worker(jobs, migrated_url, runs)
    with gated_claims(clean, "gate") as holder, running(worker):
        listener = worker.listener
        assert listener is not None
        wait_until(parked(worker), "the worker is idle")
        (job_id,) = enqueue(clean, jobs, [Ping()])
        wait_until(lambda: gate_waiters(clean) == ["listen"], "the listener's claim is held")
        terminate(clean, _listener_pid(clean))
        wait_until(lambda: listener.connects == 2, "the listener reconnected")
        open_gate(holder)
        # The killed claim rolled back; the fetch loop claims the job on its own connection,
        # without waiting for the quiet poll.
        runs.wait_for(
            lambda rs: [r.job_id for r in rs] == [job_id], "the job ran", timeout=NOTIFY_WITHIN
        )
        wait_until(lambda: count(clean) == 0, "the job completed")
    assert [r.attempt for r in runs.all] == [1]


# -- connection loss --------------------------------------------------------------------------------


def test_worker_recovers_when_its_claim_connection_is_terminated(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs, may_finish = held_kind("step")

    worker = Worker(jobs, migrated_url, concurrency=4, lease=3.0, heartbeat=0.5, poll_interval=0.2)
    try:
        with running(worker):
            ids = enqueue(clean, jobs, [Ping(n=i) for i in range(40)])
            runs.wait_for(lambda rs: len(rs) == 4, "the first batch is running")
            (claim_pid,) = wait_until(
                lambda: backend_pids(clean, CLAIM_SQL, "claim"), "the claim connection"
            )
            terminate(clean, claim_pid)
            # The batch finishes on a dead connection: its completions must not be lost.
            may_finish.set()
            wait_until(lambda: count(clean) == 0, "all jobs completed after the reconnect")
            # The claims, then the idle poll's probe (the last statement a drained worker runs).
            wait_until(
                lambda: [
                    p
                    for like in (CLAIM_SQL, PROBE_SQL)
                    for p in backend_pids(clean, like, "claim")
                    if p != claim_pid
                ],
                "claims on a new connection",
            )
    finally:
        may_finish.set()
    executions = Counter(r.job_id for r in runs.all)
    assert set(executions) == set(ids), "a job was lost"
    assert max(executions.values()) == 1, "a completion was lost and the job ran again"
    assert worker.counts["done"] == 40


# -- a busy worker's second claim connection ----------------------------------------------------------


class PeakHoldings(Holdings):
    """Records the most jobs the worker held (running and buffered) just after a claim."""

    peak = 0

    def take(self, rows: Iterable[Any], now: float) -> int:
        taken = super().take(rows, now)
        self.peak = max(self.peak, len(self.running) + len(self.buffer))
        return taken


def peak_held(worker: Worker) -> PeakHoldings:
    """Put a :class:`PeakHoldings` in ``worker`` (before it runs), reading the claims' rows as
    the one it replaces does (with due times: the worker's throughput counts pickup delays)."""
    holdings = PeakHoldings()
    holdings.timed, holdings.meta = worker.holdings.timed, worker.holdings.meta
    worker.holdings = holdings
    return holdings


def roles_of(engine: Engine, worker: Worker) -> list[str]:
    """The roles (claim, claim2, listen, ...) of ``worker``'s open connections."""
    with engine.connect() as conn:
        names = conn.execute(
            text(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE :n"
            ),
            {"n": f"sqla-jobs % {worker.name}"},
        ).scalars()
        return sorted(n.split()[1] for n in names)


def counting_pings() -> tuple[Jobs, Counter[int]]:
    """A ``ping`` kind whose async handler counts its runs, by job id."""
    jobs = Jobs()
    executions: Counter[int] = Counter()

    @jobs.kind("ping", Ping)
    async def ping(args: Ping, ctx: JobContext) -> None:
        executions[ctx.job_id] += 1

    return jobs, executions


def test_a_busy_worker_claims_on_a_second_connection_and_an_idle_one_does_not(
    clean: Engine, migrated_url: str
) -> None:
    jobs, executions = counting_pings()
    # No polling: a poll in flight when the NOTIFY comes lets the second lane claim the job (once
    # failed in CI). Parked, the listener's thread claims it.
    idle = Worker(jobs, migrated_url, concurrency=4, poll_interval=QUIET_POLL, name="idle")
    with running(idle):
        wait_until(parked(idle), "the worker is idle")
        (one,) = enqueue(clean, jobs, [Ping(n=0)])
        wait_until(lambda: count(clean) == 0, "the one job done")
        assert roles_of(clean, idle).count("claim2") == 0
    assert idle.lanes is not None
    assert idle.lanes.lanes[1].conn is None, "one job needs no second connection"
    assert idle.lanes.lanes[1].claimed == 0

    # Claims of 128 (not the automatic up to 1,024): enough round trips for both lanes to show.
    busy = Worker(jobs, migrated_url, concurrency=4, poll_interval=0.2, name="busy", batch_size=128)
    held = peak_held(busy)
    with running(busy):
        ids = enqueue(clean, jobs, [Ping(n=i) for i in range(6000)])
        wait_until(lambda: count(clean) == 0, "all 6000 jobs done", timeout=60)
        assert "claim2" in roles_of(clean, busy)
    assert busy.lanes is not None
    assert busy.lanes.lanes[1].claimed > 0, "the second lane never claimed"
    assert set(executions) == {one, *ids}
    assert max(executions.values()) == 1, "a job ran twice"
    assert busy.counts["done"] == 6000
    # Two claims in flight at once still share the worker's room: slots plus the largest prefetch.
    assert held.peak <= 4 + CAP, held.peak


def test_a_worker_of_two_slots_drains_a_backlog_on_one_claim_connection(
    clean: Engine, migrated_url: str
) -> None:
    jobs, executions = counting_pings()
    ids = enqueue(clean, jobs, [Ping(n=i) for i in range(3000)])
    # Claims of 128: many round trips, each of which could have gone out beside another.
    worker = Worker(jobs, migrated_url, concurrency=2, poll_interval=0.2, batch_size=128)
    with running(worker):
        wait_until(lambda: count(clean) == 0, "all 3000 jobs done", timeout=60)
        assert "claim2" not in roles_of(clean, worker)
    assert worker.lanes is not None
    assert len(worker.lanes.lanes) == 1
    assert worker.counts["done"] == 3000
    assert set(executions) == set(ids)
    assert max(executions.values()) == 1, "a job ran twice"


def test_claims_in_flight_on_both_connections_never_take_more_than_the_room(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()

    @jobs.kind("ping", Ping)
    async def ping(args: Ping, ctx: JobContext) -> None:
        await asyncio.sleep(0.001)

    worker = Worker(jobs, migrated_url, concurrency=4, prefetch=60, poll_interval=0.2)
    held = peak_held(worker)
    with running(worker):
        enqueue(clean, jobs, [Ping(n=i) for i in range(3000)])
        wait_until(lambda: count(clean) == 0, "all 3000 jobs done", timeout=60)
    assert worker.counts["done"] == 3000
    assert 0 < held.peak <= 4 + 60, held.peak


def test_a_killed_second_claim_connection_loses_no_job(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()
    executions: Counter[int] = Counter()

    @jobs.kind("ping", Ping)
    async def ping(args: Ping, ctx: JobContext) -> None:
        executions[ctx.job_id] += 1
        await asyncio.sleep(0.0005)

    # Claims of 128: enough round trips after the kill for the second lane to open again.
    worker = Worker(
        jobs,
        migrated_url,
        concurrency=4,
        lease=3.0,
        heartbeat=0.5,
        poll_interval=0.2,
        batch_size=128,
    )
    with running(worker):
        ids = enqueue(clean, jobs, [Ping(n=i) for i in range(6000)])
        (pid,) = wait_until(lambda: backend_pids(clean, role="claim2"), "the second connection")
        terminate(clean, pid)
        wait_until(lambda: count(clean) == 0, "all jobs done after the kill", timeout=60)
        wait_until(
            lambda: [p for p in backend_pids(clean, role="claim2") if p != pid],
            "a new second connection",
        )
    assert set(executions) == set(ids), "a job was lost"
    # At least once: only a claim in flight on the killed connection may run again (reaped).
    assert sum(n - 1 for n in executions.values()) <= worker.config.concurrency + 512


# -- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease": 30.0}, "lease (30s) is shorter than the timeout of kind 'slow' (45s)"),
        (
            {"lease": 60.0, "heartbeat": 25.0},
            "heartbeat (25s) must be > 0 and at most a third of the lease (60s)",
        ),
        ({"concurrency": 0}, "concurrency must be >= 1, got 0"),
        ({"queues": ["bad queue"]}, "invalid queue name 'bad queue'"),
        ({"queues": [""]}, "invalid queue name ''"),
        ({"queues": []}, "no queues to work"),
    ],
    ids=["lease-under-timeout", "heartbeat-over-third", "concurrency-0", "space", "empty", "none"],
)
def test_settings_that_cannot_work_are_refused_before_connecting(
    options: dict[str, Any], message: str
) -> None:
    jobs = Jobs()

    @jobs.kind("slow", Ping, timeout=45.0)
    def slow(args: Ping, ctx: JobContext) -> None:
        pass

    with pytest.raises(ConfigurationError) as info:
        Worker(jobs, NOWHERE, **options)
    assert message in str(info.value)


def test_a_long_timeout_in_a_queue_the_worker_does_not_work_is_not_refused() -> None:
    jobs = Jobs()

    @jobs.kind("slow", Ping, timeout=600.0, queue="batch")
    def slow(args: Ping, ctx: JobContext) -> None:
        pass

    @jobs.kind("quick", Pong)
    def quick(args: Pong, ctx: JobContext) -> None:
        pass

    worker = Worker(jobs, NOWHERE, queues=["default"], lease=10.0)
    assert worker.config.queues == ("default",)


# -- history ----------------------------------------------------------------------------------------


def test_keep_history_moves_finished_jobs_into_the_history_table(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()

    @jobs.kind("ping", Ping)
    async def ping(args: Ping, ctx: JobContext) -> None:
        pass

    worker = Worker(jobs, migrated_url, keep_history=True, poll_interval=0.2)
    with running(worker):
        ids = enqueue(clean, jobs, [Ping(n=i) for i in range(5)])
        wait_until(lambda: count(clean, table="sqla_jobs_history") == 5, "history rows written")
    assert count(clean) == 0
    with clean.connect() as conn:
        history = conn.execute(
            text(
                "SELECT id, kind, payload, attempts, crashes, finished_at >= created_at AS ordered "
                "FROM sqla_jobs_history ORDER BY id"
            )
        ).all()
    assert [tuple(h) for h in history] == [
        (job_id, "ping", {"n": i}, 1, 0, True) for i, job_id in enumerate(ids)
    ]
    assert worker.counts["done"] == 5
