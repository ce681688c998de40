"""Handlers that take a Session: their writes and their job's completion commit in one
transaction, fenced on the lease, with the worker's own rules for everything else."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import sqlalchemy_url
from tests._waiting import DEADLINE
from tests.integration._workers import running_workers, wait_until


class Bump(BaseModel):
    counter: int


@pytest.fixture
def counters(clean: Engine) -> Iterator[Engine]:
    """An application table of counters, 1 and 2 at zero."""
    with clean.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS app_counter, app_job_note"))
        conn.execute(text("CREATE TABLE app_counter (id int PRIMARY KEY, n int NOT NULL)"))
        conn.execute(text("INSERT INTO app_counter VALUES (1, 0), (2, 0)"))
    yield clean
    with clean.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS app_counter, app_job_note"))


def bump(session: Session, counter: int) -> None:
    session.execute(text("UPDATE app_counter SET n = n + 1 WHERE id = :id"), {"id": counter})


def count_of(engine: Engine, counter: int) -> int:
    with engine.connect() as conn:
        n: int = conn.execute(
            text("SELECT n FROM app_counter WHERE id = :id"), {"id": counter}
        ).scalar_one()
    return n


def jobs_left(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT state, attempts FROM sqla_jobs_job"))]  # type: ignore[misc]


def enqueue(engine: Engine, jobs: Jobs, *payloads: BaseModel) -> list[int]:
    with Session(engine) as session, session.begin():
        return [jobs.enqueue(session, p).id for p in payloads]


def test_a_handler_s_writes_and_its_completion_commit_together(
    counters: Engine, migrated_url: str
) -> None:
    """Each job bumps its counter once, and is deleted in the same commit."""
    jobs = Jobs()

    @jobs.kind("bump", Bump)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)

    enqueue(counters, jobs, *[Bump(counter=1 + i % 2) for i in range(10)])
    with running_workers(jobs, migrated_url) as [worker]:
        wait_until(lambda: worker.counts["done"] == 10, what="ten jobs done")
    assert (count_of(counters, 1), count_of(counters, 2)) == (5, 5)
    assert jobs_left(counters) == []


def test_a_failing_handler_s_writes_roll_back_and_the_failure_is_recorded(
    counters: Engine, migrated_url: str
) -> None:
    """The handler bumps, then raises: the bump is gone, the job failed its attempt."""
    jobs = Jobs()

    @jobs.kind("bump", Bump, max_attempts=1)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)
        session.flush()
        raise RuntimeError("boom")

    enqueue(counters, jobs, Bump(counter=1))
    with running_workers(jobs, migrated_url) as [worker]:
        wait_until(lambda: worker.counts["dead"] == 1, what="the job dead")
    assert count_of(counters, 1) == 0
    assert jobs_left(counters) == [("dead", 1)]


def test_a_lost_lease_rolls_back_the_handler_s_writes(
    counters: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While the handler runs another worker takes the job over (its lease token changes): the
    completion finds no row, so the bump rolls back with it and nothing is written over the new
    owner's lease."""
    jobs = Jobs()

    @jobs.kind("bump", Bump)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)
        with counters.begin() as conn:  # the takeover, committed apart
            conn.execute(
                text("UPDATE sqla_jobs_job SET lease_token = gen_random_uuid() WHERE id = :id"),
                {"id": ctx.job_id},
            )

    [job_id] = enqueue(counters, jobs, Bump(counter=1))
    with caplog.at_level(logging.WARNING, "sqla_jobs"), running_workers(jobs, migrated_url):
        wait_until(lambda: "lease lost before its completion" in caplog.text, what="lease lost")
    assert count_of(counters, 1) == 0
    assert jobs_left(counters) == [("running", 1)]
    with counters.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_job WHERE id = :id"), {"id": job_id})


def test_an_async_handler_gets_an_async_session_from_the_application_s_maker(
    counters: Engine, migrated_url: str
) -> None:
    """``Worker(sessionmaker=async_sessionmaker(...))``: the handler's AsyncSession is the
    application's (its ``info`` says so) and its writes commit with the completion."""
    engine = create_async_engine(sqlalchemy_url(migrated_url))
    maker = async_sessionmaker(engine, info={"app": "mine"})
    seen: list[object] = []
    jobs = Jobs()

    @jobs.kind("bump", Bump)
    async def handle(payload: Bump, ctx: JobContext, session: AsyncSession) -> None:
        seen.append(session.info.get("app"))
        await session.execute(
            text("UPDATE app_counter SET n = n + 1 WHERE id = :id"), {"id": payload.counter}
        )

    enqueue(counters, jobs, Bump(counter=2), Bump(counter=2))
    try:
        with running_workers(jobs, migrated_url, sessionmaker=maker) as [worker]:
            wait_until(lambda: worker.counts["done"] == 2, what="two jobs done")
    finally:
        import asyncio

        asyncio.run(engine.dispose())
    assert (count_of(counters, 2), seen) == (2, ["mine", "mine"])


def test_a_sync_handler_past_its_timeout_commits_nothing(
    counters: Engine, migrated_url: str
) -> None:
    """A sync handler cannot be interrupted; when it returns past its timeout its transaction
    rolls back and the run fails as timed out."""
    release = threading.Event()
    jobs = Jobs()

    started: list[JobContext] = []

    @jobs.kind("bump", Bump, timeout=0.3, max_attempts=1)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)
        started.append(ctx)
        release.wait(DEADLINE)

    def past_its_timeout() -> bool:
        left = started[0].time_left() if started else None
        return left is not None and left < 0

    enqueue(counters, jobs, Bump(counter=1))
    # A long lease: a heartbeat starved on a loaded machine cannot let the reaper take the job.
    with running_workers(jobs, migrated_url, lease=30.0, stuck_grace=DEADLINE) as [worker]:
        wait_until(past_its_timeout, what="the handler past its timeout")
        release.set()
        wait_until(lambda: worker.counts["dead"] == 1, what="the job dead")
    assert count_of(counters, 1) == 0


@pytest.mark.parametrize("deferred", ["", "DEFERRABLE INITIALLY DEFERRED"], ids=["now", "deferred"])
def test_an_application_foreign_key_to_the_job_keeps_it_completed_with_the_writes(
    counters: Engine, migrated_url: str, deferred: str
) -> None:
    """The handler writes a row pointing at its own job (NO ACTION): the DELETE is refused, so
    the job is kept ``completed`` in the same transaction and the handler's writes stand; with
    the key there before the worker starts, on the first run; added after, on the retry."""
    with counters.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE app_job_note "
                f"(job_id bigint REFERENCES sqla_jobs_job (id) {deferred}, note text)"
            )
        )
    jobs = Jobs()

    @jobs.kind("bump", Bump)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)
        session.execute(text("INSERT INTO app_job_note VALUES (:id, 'done')"), {"id": ctx.job_id})

    enqueue(counters, jobs, Bump(counter=1))
    with running_workers(jobs, migrated_url) as [worker]:
        wait_until(lambda: worker.counts["done"] == 1, what="the job done")
    assert count_of(counters, 1) == 1
    assert jobs_left(counters) == [("completed", 1)]


@pytest.mark.parametrize("deferred", ["", "DEFERRABLE INITIALLY DEFERRED"], ids=["now", "deferred"])
def test_a_foreign_key_added_under_a_running_worker_costs_one_attempt(
    counters: Engine, migrated_url: str, deferred: str
) -> None:
    """The key appears after the worker looked for such keys: the first completion is refused
    and rolls back, the job fails that attempt, and its retry keeps it ``completed``."""
    jobs = Jobs()

    @jobs.kind("bump", Bump)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)
        session.execute(text("INSERT INTO app_job_note VALUES (:id, 'done')"), {"id": ctx.job_id})

    with running_workers(jobs, migrated_url, poll_interval=0.1) as [worker]:
        with counters.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE app_job_note "
                    f"(job_id bigint REFERENCES sqla_jobs_job (id) {deferred}, note text)"
                )
            )
        [job_id] = enqueue(counters, jobs, Bump(counter=1))
        wait_until(lambda: worker.counts["failed"] == 1, what="the first attempt refused")
        with counters.begin() as conn:
            conn.execute(
                text("UPDATE sqla_jobs_job SET run_at = now() WHERE id = :id"), {"id": job_id}
            )
        wait_until(lambda: worker.counts["done"] == 1, what="the retry done")
    assert count_of(counters, 1) == 1
    assert jobs_left(counters) == [("completed", 2)]


def test_a_long_transaction_is_logged(
    counters: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler holding its transaction open past ``long_transaction`` is logged once."""
    jobs = Jobs()

    def warned() -> bool:
        return any("held its Session's transaction open" in r.getMessage() for r in caplog.records)

    @jobs.kind("bump", Bump)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)
        # The transaction stays open until the warning is seen (the loop's timer may fire late on
        # a loaded machine); a missing warning fails the assertion below, after the deadline.
        deadline = time.monotonic() + DEADLINE
        while not warned() and time.monotonic() < deadline:
            time.sleep(0.02)

    enqueue(counters, jobs, Bump(counter=1))
    with (
        caplog.at_level(logging.WARNING, "sqla_jobs"),
        running_workers(jobs, migrated_url, long_transaction=0.1) as [worker],
    ):
        wait_until(lambda: worker.counts["done"] == 1, what="the job done")
    assert "held its Session's transaction open for 0.1s" in caplog.text
    assert count_of(counters, 1) == 1


def test_with_history_the_copy_commits_with_the_handler_s_writes(
    counters: Engine, migrated_url: str
) -> None:
    """``keep_history``: the job's history row and the handler's bump in one commit."""
    maker = sessionmaker(counters)
    jobs = Jobs()

    @jobs.kind("bump", Bump)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)

    [job_id] = enqueue(counters, jobs, Bump(counter=2))
    with running_workers(jobs, migrated_url, keep_history=True, sessionmaker=maker) as [worker]:
        wait_until(lambda: worker.counts["done"] == 1, what="the job done")
    with counters.connect() as conn:
        kept = conn.execute(text("SELECT id FROM sqla_jobs_history")).scalars().all()
    assert (count_of(counters, 2), kept, jobs_left(counters)) == (1, [job_id], [])


def test_ctx_step_is_refused_in_a_handler_that_takes_a_session(
    counters: Engine, migrated_url: str
) -> None:
    """A durable step would outlive writes that roll back: it is refused with a clear error,
    the run fails and its writes are rolled back."""
    jobs = Jobs()

    @jobs.kind("bump", Bump, max_attempts=1)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)
        ctx.step("mail", lambda: None)

    enqueue(counters, jobs, Bump(counter=1))
    with running_workers(jobs, migrated_url) as [worker]:
        wait_until(lambda: worker.counts["dead"] == 1, what="the job dead")
    assert count_of(counters, 1) == 0
    with counters.connect() as conn:
        error = conn.execute(text("SELECT last_error FROM sqla_jobs_job")).scalar_one()
    assert "StepError" in error
    assert "durable steps do not mix with a handler that takes a session" in error


def test_a_job_its_own_transaction_completed_is_not_reported_as_lost(
    counters: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Heartbeats that run between the handler's commit and the end of its run find the row
    gone (deleted by that commit): no "lease lost" is logged for a job that completed."""
    maker = sessionmaker(counters)

    @event.listens_for(maker, "after_commit")
    def slow(session: Session) -> None:
        # The injected fault: the runner thread slow to hand its result back (GIL, load), for
        # several heartbeats.
        time.sleep(1.0)

    jobs = Jobs()

    @jobs.kind("bump", Bump)
    def handle(payload: Bump, ctx: JobContext, session: Session) -> None:
        bump(session, payload.counter)

    enqueue(counters, jobs, Bump(counter=1))
    with (
        caplog.at_level(logging.WARNING, "sqla_jobs"),
        # Heartbeats every 0.3 s, in a lease no starved heartbeat on a loaded machine lets lapse.
        running_workers(jobs, migrated_url, sessionmaker=maker, lease=6.0, heartbeat=0.3) as [w],
    ):
        wait_until(lambda: w.counts["done"] == 1, what="the job done")
    assert "lease lost" not in caplog.text
    assert count_of(counters, 1) == 1
