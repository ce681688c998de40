"""The operations through the Python API, in the caller's transaction, against real workers:
retry, cancel (pending, and running async and sync jobs), pause and resume, snooze, discard, and
the per-attempt error record."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import (
    Discard,
    JobCancelledError,
    JobContext,
    JobNotFoundError,
    Jobs,
    JobStateError,
    OutcomeEvent,
    Snooze,
    Worker,
)
from sqla_jobs.metrics import Metrics
from tests._waiting import wait_until
from tests.conftest import REPO

from .test_metrics import scrape, value
from .test_worker import DEADLINE, enqueue, execute, job_row, running


class Task(BaseModel):
    n: int = 0


def state(engine: Engine, job_id: int) -> str | None:
    row = job_row(engine, job_id)
    return None if row is None else str(row.state)


def dead_job(engine: Engine, jobs: Jobs) -> int:
    """A job that is dead after one failed attempt (set by hand: no worker needed)."""
    (job_id,) = enqueue(engine, jobs, [Task()])
    execute(
        engine,
        "UPDATE sqla_jobs_job SET state = 'dead', attempts = 3, crashes = 1,"
        " last_error = 'boom', finished_at = now() WHERE id = :id",
        id=job_id,
    )
    return job_id


def test_a_retried_dead_job_runs_again_with_both_budgets_whole_and_succeeds(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    seen: list[tuple[int, int]] = []

    @jobs.kind("task", Task)
    def task(args: Task, ctx: JobContext) -> None:
        seen.append((ctx.attempt, ctx.crashes))

    job_id = dead_job(clean, jobs)
    with Session(clean) as session, session.begin():
        assert jobs.retry(session, [job_id]) == [job_id]
    row = job_row(clean, job_id)
    assert row is not None
    assert (row.state, row.attempts, row.crashes, row.finished_at) == ("pending", 0, 0, None)
    assert row.last_error == "boom", "the record of what happened stays"
    with running(Worker(jobs, migrated_url, poll_interval=0.2)):
        wait_until(lambda: job_row(clean, job_id) is None, "the retried job completes")
    assert seen == [(1, 0)]


def test_retry_by_filter_takes_the_dead_jobs_of_a_kind_only(clean: Engine) -> None:
    jobs = Jobs()
    jobs.register("task", Task)
    other = Jobs()
    other.register("other", Task)
    mine, theirs = dead_job(clean, jobs), dead_job(clean, other)
    (pending,) = enqueue(clean, jobs, [Task()], delay=3600)
    with Session(clean) as session, session.begin():
        assert jobs.retry(session, kind="task") == [mine]
    assert (state(clean, mine), state(clean, theirs), state(clean, pending)) == (
        "pending",
        "dead",
        "pending",
    )


def test_an_unknown_id_or_a_running_job_changes_nothing_and_leaves_the_transaction_usable(
    clean: Engine,
) -> None:
    jobs = Jobs()
    jobs.register("task", Task)
    dead = dead_job(clean, jobs)
    (busy,) = enqueue(clean, jobs, [Task()])
    execute(
        clean,
        "UPDATE sqla_jobs_job SET state = 'running', lease_token = gen_random_uuid(),"
        " lease_expires_at = now() + interval '1 hour' WHERE id = :id",
        id=busy,
    )
    with Session(clean) as session, session.begin():
        with pytest.raises(JobNotFoundError, match="no job with id 999999999: nothing changed"):
            jobs.retry(session, [dead, 999999999])
        with pytest.raises(JobStateError, match=f"cannot retry: job {busy} is running"):
            jobs.retry(session, [dead, busy])
        assert session.execute(text("SELECT 1")).scalar() == 1, "the transaction is usable"
    assert state(clean, dead) == "dead"


def test_a_cancelled_pending_job_never_runs(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()
    ran: list[int] = []
    jobs.register("task", Task, lambda args, ctx: ran.append(ctx.job_id))
    cancelled_id, kept_id = enqueue(clean, jobs, [Task(n=1), Task(n=2)], delay=0.5)
    with Session(clean) as session, session.begin():
        result = jobs.cancel(session, [cancelled_id])
    assert (result.cancelled, result.requested) == ([cancelled_id], [])
    with running(Worker(jobs, migrated_url, poll_interval=0.2)):
        wait_until(lambda: job_row(clean, kept_id) is None, "the other job runs")
    assert ran == [kept_id]
    row = job_row(clean, cancelled_id)
    assert row is not None
    assert (row.state, row.attempts) == ("cancelled", 0)
    assert row.finished_at is not None
    with (
        Session(clean) as session,
        session.begin(),
        pytest.raises(JobStateError, match="is cancelled"),
    ):
        jobs.cancel(session, [cancelled_id])


def test_a_running_async_job_is_cancelled_at_once_and_not_retried(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    started = threading.Event()
    stopped: list[str] = []

    @jobs.kind("slow", Task)
    async def slow(args: Task, ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.append("cancelled")
            raise

    # Heartbeats every 20 s and no polling: only the NOTIFY can tell the worker in time.
    worker = Worker(jobs, migrated_url, poll_interval=30, lease=60)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Task()])
        assert started.wait(DEADLINE)
        with Session(clean) as session, session.begin():
            assert jobs.cancel(session, [job_id]).requested == [job_id]
        wait_until(lambda: state(clean, job_id) == "cancelled", "the run ends cancelled", 3)
    assert stopped == ["cancelled"]
    row = job_row(clean, job_id)
    assert row is not None
    assert row.last_error == "cancelled: the handler was cancelled"
    assert worker.counts["cancelled"] == 1
    assert worker.counts["failed"] == 0


def test_a_running_sync_job_sees_ctx_cancelled_and_its_steps_are_refused(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    started = threading.Event()
    refused: list[str] = []

    @jobs.kind("loop", Task)
    def loop(args: Task, ctx: JobContext) -> None:
        started.set()
        assert ctx.cancelled.wait(DEADLINE), "never told"
        try:
            ctx.step("next", lambda: 1)
        except JobCancelledError as exc:
            refused.append(str(exc))
            raise

    worker = Worker(jobs, migrated_url, poll_interval=30, lease=60)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Task()])
        assert started.wait(DEADLINE)
        with Session(clean) as session, session.begin():
            jobs.cancel(session, [job_id])
        wait_until(lambda: state(clean, job_id) == "cancelled", "the run ends cancelled", 3)
    assert refused == [f"job {job_id} was cancelled: step 'next' not started"]


def test_a_sync_handler_that_ignores_the_cancel_and_returns_completes_and_says_so(
    clean: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The job completes (its handler returned), and the worker says it was told and ignored:
    in its log, in the outcome its hooks hear, and in its metrics."""
    caplog.set_level(logging.INFO, logger="sqla_jobs.worker")
    jobs = Jobs()
    told = threading.Event()
    heard: list[OutcomeEvent] = []
    jobs.hooks.on_outcome(heard.append)

    @jobs.kind("stubborn", Task)
    def stubborn(args: Task, ctx: JobContext) -> None:
        told.set() if ctx.cancelled.wait(DEADLINE) else None

    metrics = Metrics(port=0, sample_interval=None)
    with running(Worker(jobs, migrated_url, poll_interval=30, lease=60, metrics=metrics)):
        (job_id,) = enqueue(clean, jobs, [Task()])
        wait_until(lambda: state(clean, job_id) == "running", "the job runs")
        with Session(clean) as session, session.begin():
            jobs.cancel(session, [job_id])
        wait_until(lambda: job_row(clean, job_id) is None, "the job completes anyway")
        samples = scrape(metrics)
    assert told.is_set()
    by_event = {getattr(r, "event", None): r for r in caplog.records}
    asked = by_event["cancel_requested"]
    assert (asked.levelname, getattr(asked, "job_id", None)) == ("INFO", job_id)
    assert "sync handler" in asked.getMessage()
    assert "ctx.cancelled" in asked.getMessage()
    ignored = by_event["cancel_ignored"]
    assert ignored.levelname == "WARNING"
    assert ignored.getMessage() == (
        f"job {job_id} (stubborn) completed after a cancel request: its handler returned "
        "without stopping (a sync handler must check ctx.cancelled)"
    )
    (event,) = heard
    assert (event.outcome, event.cancel_requested) == ("completed", True)
    assert (
        value(samples, "sqla_jobs_job_cancels_ignored_total", kind="stubborn", queue="default") == 1
    )


def test_a_run_no_one_asked_to_cancel_is_heard_without_a_cancel_request(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    heard: list[OutcomeEvent] = []
    jobs.hooks.on_outcome(heard.append)

    @jobs.kind("plain", Task)
    def plain(args: Task, ctx: JobContext) -> None:
        pass

    with running(Worker(jobs, migrated_url, poll_interval=0.2)):
        (job_id,) = enqueue(clean, jobs, [Task()])
        wait_until(lambda: len(heard) == 1, "the run is heard")
    assert (heard[0].job_id, heard[0].outcome, heard[0].cancel_requested) == (
        job_id,
        "completed",
        False,
    )


def test_a_cancel_stored_while_its_worker_dies_makes_the_reaper_cancel_the_job(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    jobs.register("task", Task, lambda args, ctx: None)
    (job_id,) = enqueue(clean, jobs, [Task()])
    # A job its dead worker held, with an expired lease, and the operator's cancel stored.
    execute(
        clean,
        "UPDATE sqla_jobs_job SET state = 'running', locked_by = 'dead', attempts = 1,"
        " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour'"
        " WHERE id = :id",
        id=job_id,
    )
    with Session(clean) as session, session.begin():
        assert jobs.cancel(session, [job_id]).requested == [job_id]
    execute(clean, "UPDATE sqla_jobs_job SET lease_expires_at = now() WHERE id = :id", id=job_id)
    with running(Worker(jobs, migrated_url, lease=3, reap_interval=0.2, poll_interval=0.2)):
        wait_until(lambda: state(clean, job_id) == "cancelled", "reaped as cancelled")


def test_a_paused_queue_is_not_claimed_until_resumed_and_enqueue_still_works(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    ran = threading.Event()
    jobs.register("task", Task, lambda args, ctx: ran.set(), queue="mail")
    with Session(clean) as session, session.begin():
        jobs.pause_queue(session, "mail")
    worker = Worker(jobs, migrated_url, poll_interval=0.1)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Task()])
        wait_until(lambda: worker.wakeups is not None and worker.wakeups.drained, "polled")
        # A window for what must not happen: ten polls' worth, so that a loaded machine still
        # polls within it.
        assert not ran.wait(1.0), "a job of a paused queue ran"
        with Session(clean) as session, session.begin():
            jobs.resume_queue(session, "mail")
        assert ran.wait(DEADLINE)
    assert job_row(clean, job_id) is None


def test_snooze_puts_the_job_back_later_without_spending_a_budget(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    runs: list[int] = []

    @jobs.kind("later", Task)
    def later(args: Task, ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise Snooze(timedelta(hours=1))

    worker = Worker(jobs, migrated_url, poll_interval=0.2)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Task()])
        wait_until(lambda: worker.counts["snoozed"] == 1, "snoozed")
    row = job_row(clean, job_id)
    assert row is not None
    assert (row.state, row.attempts, row.crashes, row.last_error) == ("pending", 0, 0, None)
    # Read after the worker's stop, which a loaded machine can make slow: within a deadline of it.
    assert 3600 - DEADLINE < row.due_in <= 3600


def test_discard_makes_the_job_dead_at_once_and_failures_keep_one_error_per_attempt(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()

    @jobs.kind("picky", Task, max_attempts=10)
    def picky(args: Task, ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise ValueError("first try fails")
        raise Discard("the order was deleted")

    worker = Worker(jobs, migrated_url, poll_interval=0.1)
    with running(worker):
        (job_id,) = enqueue(clean, jobs, [Task()])
        wait_until(lambda: worker.counts["failed"] == 1, "the first attempt fails")
        execute(clean, "UPDATE sqla_jobs_job SET run_at = now() WHERE id = :id", id=job_id)
        wait_until(lambda: state(clean, job_id) == "dead", "discarded on the second attempt")
    with clean.connect() as conn:
        errors: list[dict[str, Any]] = conn.execute(
            text("SELECT errors FROM sqla_jobs_job WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    assert [(e["attempt"], e["error"], e["message"]) for e in errors] == [
        (1, "ValueError", "first try fails"),
        (2, "Discard", "the order was deleted"),
    ]
    assert "Traceback (most recent call last)" in errors[0]["traceback"]
    assert 'raise ValueError("first try fails")' in errors[0]["traceback"]
    row = job_row(clean, job_id)
    assert row is not None
    assert row.last_error == "discarded: the order was deleted"


def test_get_returns_the_job_as_the_transaction_sees_it(clean: Engine) -> None:
    jobs = Jobs()
    jobs.register("task", Task)
    with Session(clean) as session, session.begin():
        job = jobs.enqueue(session, Task(n=5))
        assert jobs.get(session, job.id) is job
        assert jobs.get(session, 999999999) is None


def test_the_guide_select_recipes_list_dead_jobs_and_filter_by_meta(clean: Engine) -> None:
    """The ``select(Job)`` recipes of docs/jobs.md ("Reading jobs"), run as they are printed."""
    page = (REPO / "docs" / "jobs.md").read_text()
    section = page.split("\n## Reading jobs\n", 1)[1].split("\n## ", 1)[0]
    (recipes,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)

    jobs = Jobs()
    jobs.register("task", Task, queue="mail")
    dead = dead_job(clean, jobs)
    with Session(clean) as session, session.begin():
        tagged = jobs.enqueue(session, Task(n=1), meta={"tenant": "acme"}).id
        jobs.enqueue(session, Task(n=2), meta={"tenant": "other"})
        jobs.enqueue(session, Task(n=3), queue="reports")
    with Session(clean) as session:
        names: dict[str, Any] = {"session": session}
        exec(compile(recipes, "docs/jobs.md", "exec"), names)

        assert [j.id for j in names["dead"]] == [dead]
        assert [j.id for j in names["acme"]] == [tagged]
        assert {(q, st): n for q, st, n in names["depth"]} == {
            ("mail", "dead"): 1,
            ("mail", "pending"): 2,
            ("reports", "pending"): 1,
        }


def test_async_operations_ride_the_async_session(clean: Engine, migrated_url: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from sqla_jobs.db.urls import sqlalchemy_url

    jobs = Jobs()
    jobs.register("task", Task)
    dead = dead_job(clean, jobs)

    async def main() -> tuple[list[int], Any]:
        engine = create_async_engine(sqlalchemy_url(migrated_url))
        try:
            async with AsyncSession(engine) as session, session.begin():
                retried = await jobs.retry_async(session, [dead])
                result = await jobs.cancel_async(session, [dead])
                await jobs.pause_queue_async(session, "default")
                await jobs.resume_queue_async(session, "default")
                got = await jobs.get_async(session, dead)
                return retried, (result, got is not None)
        finally:
            await engine.dispose()

    retried, (result, found) = asyncio.run(main())
    assert retried == [dead]
    assert result.cancelled == [dead]
    assert found
    assert state(clean, dead) == "cancelled"
