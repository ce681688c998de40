"""Re-runs a handler can tell apart, and never two runs of one job in one process: a job claimed
again while its lost-lease run still runs here waits for that run; a run given back at shutdown is
counted as an interruption; the reaper runs on its own schedule and wakes the queues it refills."""

from __future__ import annotations

import asyncio
import threading
import time

from pydantic import BaseModel
from sqlalchemy import Engine

from sqla_jobs import JobContext, Jobs, Worker
from sqla_jobs.testing import WorkerSeams
from tests._waiting import wait_until

from .test_worker import DEADLINE, enqueue, execute, job_row, running


class Task(BaseModel):
    n: int = 0


def test_a_job_claimed_again_while_its_lost_run_still_runs_here_waits_for_that_run(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    lock = threading.Lock()
    spans: list[tuple[int, float, float | None]] = []  # (crashes, started, ended)
    first_may_finish = threading.Event()

    @jobs.kind("long", Task)
    def long(args: Task, ctx: JobContext) -> None:
        with lock:
            spans.append((ctx.crashes, time.monotonic(), None))
            index = len(spans) - 1
        if ctx.crashes == 0:
            first_may_finish.wait(DEADLINE)
        with lock:
            spans[index] = (spans[index][0], spans[index][1], time.monotonic())

    paused = threading.Event()
    paused.set()  # the lease runs out while the first run is still going
    worker = Worker(
        jobs,
        migrated_url,
        concurrency=2,
        lease=1.5,
        heartbeat=0.5,
        reap_interval=0.2,
        poll_interval=0.2,
        seams=WorkerSeams(heartbeats_paused=paused),
    )
    try:
        with running(worker):
            (job_id,) = enqueue(clean, jobs, [Task()])
            wait_until(lambda: len(spans) == 1, "the first run starts")
            first = job_row(clean, job_id)
            assert first is not None

            def claimed_again() -> bool:
                now = job_row(clean, job_id)
                return (
                    now is not None
                    and now.state == "running"
                    and now.crashes == 1
                    and now.locked_by == worker.name
                )

            # Reaped by the worker's own reaper, then claimed again by the same process.
            wait_until(claimed_again, "the same worker claims the reaped job again")
            paused.clear()
            assert len(spans) == 1, "the second claim ran beside the first run"
            first_may_finish.set()
            wait_until(lambda: job_row(clean, job_id) is None, "the second run completes the job")
    finally:
        first_may_finish.set()
    (c1, _, end1), (c2, start2, end2) = spans
    assert (c1, c2) == (0, 1)
    assert end1 is not None
    assert end2 is not None
    assert start2 >= end1, "two runs of one job overlapped in one process"


def test_a_run_given_back_at_the_shutdown_timeout_is_an_interruption_the_next_run_sees(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    seen: list[tuple[int, int, int, bool]] = []
    started = threading.Event()

    @jobs.kind("slow", Task)
    async def slow(args: Task, ctx: JobContext) -> None:
        seen.append((ctx.attempt, ctx.crashes, ctx.interruptions, ctx.rerun))
        started.set()
        if ctx.interruptions == 0:
            await asyncio.Event().wait()  # outlives the shutdown timeout

    with running(Worker(jobs, migrated_url, shutdown_timeout=0.2, poll_interval=0.2)):
        (job_id,) = enqueue(clean, jobs, [Task()])
        assert started.wait(DEADLINE)
    row = job_row(clean, job_id)
    assert row is not None
    assert (row.state, row.attempts, row.crashes, row.interruptions) == ("pending", 0, 0, 1)
    with running(Worker(jobs, migrated_url, poll_interval=0.2)):
        wait_until(lambda: job_row(clean, job_id) is None, "the job runs again and completes")
    # Neither budget spent, yet the second run knows it is a re-run.
    assert seen == [(1, 0, 0, False), (1, 0, 1, True)]


def test_the_reaper_runs_on_its_own_schedule_and_wakes_the_queue_it_refills(
    clean: Engine, migrated_url: str
) -> None:
    """Reaping is not rounded up to a heartbeat tick (3 s here), and the reaped job is picked up
    at once by a worker that would otherwise poll only every 30 s."""
    jobs = Jobs()
    ran = threading.Event()

    @jobs.kind("rescued", Task)
    def rescued(args: Task, ctx: JobContext) -> None:
        ran.set()

    worker = Worker(jobs, migrated_url, lease=9, heartbeat=3, reap_interval=0.3, poll_interval=30)
    with running(worker):
        assert worker.listener is not None
        wait_until(worker.listener.connected.is_set, "the listener is connected")
        (job_id,) = enqueue(clean, jobs, [Task()], delay=3600)
        # A job a dead worker held: running, its lease expired a moment ago.
        execute(
            clean,
            "UPDATE sqla_jobs_job SET state = 'running', run_at = now(), locked_by = 'dead',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() WHERE id = :id",
            id=job_id,
        )
        # Well under the 30 s poll (only the reaper's wakeup explains it), for a loaded machine.
        assert ran.wait(15.0), "the reaped job did not run without waiting for the poll"
