"""Job ids past 2**31 (and a few ids short of the BIGINT maximum): every path that carries an id.

Ids are BIGINT, but an id squeezed through a 32-bit integer anywhere (a bind type, an array type, a
cast, a log format) would only fail once a busy queue had run two billion jobs. Each test runs
against its own database whose identity is restarted past 2**31 (``ALTER TABLE sqla_jobs_job ALTER
COLUMN id RESTART WITH ...``): enqueue, enqueue_many, the claim (plain and keyed), heartbeats,
durable steps, failure, completion into history, the reaper, the release at shutdown and
``testing.run_jobs``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from alembic import command
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, Worker, testing
from sqla_jobs.db.urls import sqlalchemy_url
from tests.conftest import alembic_config, create_database, drop_database
from tests.reliability import edge_app
from tests.reliability.conftest import Figures, injects
from tests.reliability.edge_app import wait_running

INT32_MAX = 2**31 - 1
STARTS = {"5e9": 5_000_000_000, "bigint_max-1000": 2**63 - 1_000}

jobs = Jobs()


class Step(BaseModel):
    n: int


class Slow(BaseModel):
    seconds: float


class Keyed(BaseModel):
    key: str


class Hold(BaseModel):
    n: int


@dataclass
class Seen:
    lock: threading.Lock = field(default_factory=threading.Lock)
    job_ids: list[int] = field(default_factory=list)
    step_calls: int = 0
    hold: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)


seen = Seen()


@jobs.kind("big_step", Step, queue="big")
def step(args: Step, ctx: JobContext) -> None:
    def once() -> int:
        with seen.lock:
            seen.step_calls += 1
        return ctx.job_id

    assert ctx.step("one", once) == ctx.job_id
    if ctx.attempt == 1:
        raise RuntimeError("fails after step one, once")
    with seen.lock:
        seen.job_ids.append(ctx.job_id)


@jobs.kind("big_slow", Slow, queue="big")
def slow(args: Slow, ctx: JobContext) -> None:
    threading.Event().wait(args.seconds)  # long enough for several heartbeats
    with seen.lock:
        seen.job_ids.append(ctx.job_id)


@jobs.kind("big_keyed", Keyed, queue="big", concurrency_key=lambda p: p.key)
def keyed(args: Keyed, ctx: JobContext) -> None:
    with seen.lock:
        seen.job_ids.append(ctx.job_id)


@jobs.kind("big_hold", Hold, queue="hold")
def hold(args: Hold, ctx: JobContext) -> None:
    seen.holding.set()
    seen.hold.wait(30)


@dataclass
class BigIds:
    url: str
    engine: Engine
    start: int


@pytest.fixture(scope="module", params=list(STARTS))
def big(request: pytest.FixtureRequest, server_url: str) -> Iterator[BigIds]:
    """A database of its own, migrated, whose next job id is ``start``."""
    start = STARTS[request.param]
    url = create_database(server_url, prefix="sqla_jobs_bigids")
    try:
        command.upgrade(alembic_config(url), "head")
        engine = create_engine(sqlalchemy_url(url))
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE sqla_jobs_job ALTER COLUMN id RESTART WITH {start}"))
        yield BigIds(url, engine, start)
        engine.dispose()
    finally:
        drop_database(server_url, url)


@pytest.fixture
def fresh(big: BigIds) -> BigIds:
    global seen
    seen = Seen()
    with big.engine.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_job, sqla_jobs_history"))
    return big


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


@injects("job ids past 2**31 (identity restarted)")
def test_enqueue_and_enqueue_many_return_ids_past_2_31(fresh: BigIds, figures: Figures) -> None:
    """enqueue and enqueue_many return the BIGINT ids the database assigned, past 2**31."""
    with Session(fresh.engine) as session:
        one = jobs.enqueue(session, Step(n=1)).id
        many = jobs.enqueue_many(session, [Step(n=i) for i in range(3)])
        listed = [j.id for j in testing.enqueued(session, "big_step")]
        session.commit()
    assert one >= fresh.start > INT32_MAX
    assert many == list(range(many[0], many[0] + 3))
    assert listed == [one, *many]
    assert scalar(fresh.engine, "SELECT max(id) FROM sqla_jobs_job") == many[-1]
    figures.record(first_id=one, last_id=many[-1])


@injects("job ids past 2**31 (identity restarted)")
def test_worker_runs_every_statement_on_jobs_with_ids_past_2_31(
    fresh: BigIds, figures: Figures
) -> None:
    """With ids past 2**31 a worker claims (plain and keyed), heartbeats, records a step, fails,
    retries, completes into history and reaps an expired lease; history keeps the same ids."""
    engine = fresh.engine
    with Session(engine) as session:
        step_id = jobs.enqueue(session, Step(n=1)).id
        slow_id = jobs.enqueue(session, Slow(seconds=1.0)).id
        keyed_ids = jobs.enqueue_many(session, [Keyed(key="k"), Keyed(key="k")])
        crashed_id = jobs.enqueue(session, Keyed(key="crashed")).id
        session.flush()
        session.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'running', attempts = 1, "
                "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second', "
                "locked_by = 'vanished' WHERE id = :id"
            ),
            {"id": crashed_id},
        )
        session.commit()
    worker = Worker(
        jobs,
        fresh.url,
        queues=["big"],
        lease=1.5,
        heartbeat=0.2,
        poll_interval=0.1,
        keep_history=True,
    )

    def lease_end() -> Any:
        return scalar(
            engine,
            "SELECT lease_expires_at FROM sqla_jobs_job WHERE id = :id AND state = 'running'",
            id=slow_id,
        )

    with edge_app.running(worker) as crashes:
        first = wait_running(crashes, lease_end, "the slow job is claimed")

        def renewed_lease() -> Any:
            end = lease_end()
            return end if end is not None and end > first else None

        renewed = wait_running(crashes, renewed_lease, "a heartbeat renews the lease")
        wait_running(
            crashes,
            lambda: (
                scalar(engine, "SELECT attempts FROM sqla_jobs_job WHERE id = :id", id=step_id) == 1
                and scalar(engine, "SELECT state FROM sqla_jobs_job WHERE id = :id", id=step_id)
                == "pending"
            ),
            "the step job's failure is recorded",
        )
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE sqla_jobs_job SET run_at = now() WHERE id = :id"), {"id": step_id}
            )
        wait_running(
            crashes,
            lambda: scalar(engine, "SELECT count(*) FROM sqla_jobs_job") == 0,
            "every job is completed",
        )
    with engine.connect() as conn:
        history = dict(conn.execute(text("SELECT id, attempts FROM sqla_jobs_history")).all())
    expected = {step_id: 2, slow_id: 1, crashed_id: 2, **dict.fromkeys(keyed_ids, 1)}
    assert history == expected
    assert sorted(seen.job_ids) == sorted(expected)
    assert all(i > INT32_MAX for i in history)
    assert seen.step_calls == 1
    assert worker.reaper is not None
    assert worker.reaper.reaped == 1
    figures.record(
        ids=sorted(history),
        lease_renewed_by_s=(renewed - first).total_seconds(),
        reaped=worker.reaper.reaped,
    )


@injects("job ids past 2**31 (identity restarted); a worker stopped mid-job")
def test_worker_releases_a_job_with_an_id_past_2_31_at_shutdown(
    fresh: BigIds, figures: Figures
) -> None:
    """A worker stopped while a job with an id past 2**31 runs past its shutdown timeout gives
    the job back: pending again, its claim undone."""
    with Session(fresh.engine) as session:
        job_id = jobs.enqueue(session, Hold(n=1)).id
        session.commit()
    worker = Worker(jobs, fresh.url, queues=["hold"], shutdown_timeout=0.1, poll_interval=0.1)
    try:
        with edge_app.running(worker) as crashes:
            wait_running(crashes, seen.holding.is_set, "the job starts")
    finally:
        seen.hold.set()
    with fresh.engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, attempts, lease_token FROM sqla_jobs_job WHERE id = :id"),
            {"id": job_id},
        ).one()
    assert tuple(row) == ("pending", 0, None)
    assert worker.counts["released"] == 1
    figures.record(job_id=job_id, released=1)


@injects("job ids past 2**31 (identity restarted)")
def test_testing_run_jobs_runs_jobs_with_ids_past_2_31(fresh: BigIds, figures: Figures) -> None:
    """testing.run_jobs claims, runs (recording a step), fails and completes jobs with ids past
    2**31 inside the test's transaction."""
    with Session(fresh.engine) as session:
        job_id = jobs.enqueue(session, Step(n=1)).id
        first = testing.run_jobs(jobs, session, queues=["big"], raise_errors=False)
        assert (first.done, first.failed) == (0, 1)
        session.execute(
            text("UPDATE sqla_jobs_job SET run_at = now() WHERE id = :id"), {"id": job_id}
        )
        second = testing.run_jobs(jobs, session, queues=["big"])
        assert second.done == 1
        assert testing.enqueued(session) == []
        session.rollback()
    assert seen.job_ids == [job_id]
    assert seen.step_calls == 1
    assert job_id > INT32_MAX
    figures.record(job_id=job_id)
