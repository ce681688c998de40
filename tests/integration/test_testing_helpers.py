"""``sqla_jobs.testing`` sees the jobs this test's transaction wrote, moves time without sleeping,
and asserts on what was enqueued (sync and async)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import JobContext, Jobs, testing
from sqla_jobs.db.urls import sqlalchemy_url


class Invoice(BaseModel):
    invoice_id: int
    note: str = ""


class Ping(BaseModel):
    n: int


@pytest.fixture
def ran() -> list[int]:
    return []


@pytest.fixture
def jobs(ran: list[int]) -> Jobs:
    registry = Jobs()

    @registry.kind("send_invoice", Invoice)
    def send_invoice(args: Invoice, ctx: JobContext) -> None:
        ran.append(args.invoice_id)

    registry.register("ping", Ping)
    return registry


@pytest.fixture
def session(clean: Engine) -> Iterator[Session]:
    """A session in a transaction rolled back at the end, as a test's would be."""
    with Session(clean) as s, s.begin():
        yield s
        s.rollback()


def _left_by_another_test(engine: Engine, jobs: Jobs, invoice_id: int) -> None:
    with Session(engine) as s, s.begin():
        jobs.enqueue(s, Invoice(invoice_id=invoice_id))


def test_run_jobs_runs_only_the_jobs_this_transaction_wrote(
    clean: Engine, jobs: Jobs, ran: list[int], session: Session
) -> None:
    _left_by_another_test(clean, jobs, 40)
    jobs.enqueue(session, Invoice(invoice_id=1))
    assert testing.run_jobs(jobs, session).done == 1
    assert ran == [1]
    left = testing.enqueued(session, all_jobs=True)
    assert [j.payload["invoice_id"] for j in left] == [40]


def test_all_jobs_runs_every_due_job_the_session_can_see(
    clean: Engine, jobs: Jobs, ran: list[int], session: Session
) -> None:
    _left_by_another_test(clean, jobs, 40)
    jobs.enqueue(session, Invoice(invoice_id=1))
    assert testing.run_jobs(jobs, session, all_jobs=True).done == 2
    assert sorted(ran) == [1, 40]


def test_jobs_written_in_a_released_savepoint_are_this_tests(
    jobs: Jobs, ran: list[int], session: Session
) -> None:
    """A savepoint has an xid of its own: its rows still belong to the test's transaction."""
    with session.begin_nested():
        jobs.enqueue(session, Invoice(invoice_id=2))
    with session.begin_nested():
        jobs.enqueue(session, Invoice(invoice_id=3))
        with session.begin_nested():
            jobs.enqueue(session, Invoice(invoice_id=4))
    assert testing.run_jobs(jobs, session).done == 3
    assert sorted(ran) == [2, 3, 4]


def test_a_job_this_test_failed_is_run_again_once_due(session: Session) -> None:
    """The failure updated the row in this transaction: it stays this test's job."""
    jobs = Jobs()
    calls: list[int] = []

    @jobs.kind("flaky", Ping)
    def flaky(args: Ping, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")

    jobs.enqueue(session, Ping(n=1))
    first = testing.run_jobs(jobs, session, raise_errors=False)
    assert (first.done, first.failed) == (0, 1)
    assert testing.run_jobs(jobs, session).done == 0, "backing off"
    assert testing.run_jobs(jobs, session, until=timedelta(hours=1)).done == 1
    assert calls == [1, 2]


def test_delayed_jobs_run_only_within_until_or_with_include_delayed(
    jobs: Jobs, ran: list[int], session: Session
) -> None:
    jobs.enqueue(session, Invoice(invoice_id=1), delay=timedelta(hours=1))
    jobs.enqueue(session, Invoice(invoice_id=2), delay=timedelta(days=30))
    assert testing.run_jobs(jobs, session).done == 0
    assert testing.run_jobs(jobs, session, until=timedelta(minutes=59)).done == 0
    assert testing.run_jobs(jobs, session, until=3601).done == 1
    assert ran == [1]
    assert testing.run_jobs(jobs, session, include_delayed=True).done == 1
    assert ran == [1, 2]


def test_until_must_not_move_time_backwards(jobs: Jobs, session: Session) -> None:
    with pytest.raises(ValueError, match="until must be >= 0"):
        testing.run_jobs(jobs, session, until=timedelta(seconds=-1))


def test_enqueued_ignores_jobs_another_transaction_committed(
    clean: Engine, jobs: Jobs, session: Session
) -> None:
    _left_by_another_test(clean, jobs, 40)
    assert testing.enqueued(session) == []
    jobs.enqueue(session, Invoice(invoice_id=1))
    assert [j.payload["invoice_id"] for j in testing.enqueued(session, Invoice, jobs=jobs)] == [1]
    assert len(testing.enqueued(session, "send_invoice", all_jobs=True)) == 2


def test_assert_enqueued_matches_payload_fields_and_returns_the_job(
    jobs: Jobs, session: Session
) -> None:
    jobs.enqueue(session, Invoice(invoice_id=7, note="first"), queue="billing", priority=3)
    jobs.enqueue(session, Invoice(invoice_id=8))
    job = testing.assert_enqueued(session, Invoice, jobs=jobs, invoice_id=7)
    assert (job.queue, job.priority, job.payload["note"]) == ("billing", 3, "first")
    # Without a registry the fields compare as the payload's JSON values.
    assert testing.assert_enqueued(session, "send_invoice", invoice_id=8).id > job.id
    testing.assert_enqueued(session, "send_invoice")


def test_assert_enqueued_lists_what_was_enqueued_when_nothing_matches(
    clean: Engine, jobs: Jobs, session: Session
) -> None:
    _left_by_another_test(clean, jobs, 9)
    jobs.enqueue(session, Invoice(invoice_id=8))
    with pytest.raises(AssertionError, match=r"send_invoice\(invoice_id=9\).*'invoice_id': 8"):
        testing.assert_enqueued(session, Invoice, jobs=jobs, invoice_id=9)
    assert testing.assert_enqueued(session, Invoice, jobs=jobs, all_jobs=True, invoice_id=9)
    with pytest.raises(TypeError, match="Invoice has no field 'invoce_id'"):
        testing.assert_enqueued(session, Invoice, jobs=jobs, invoce_id=8)


def test_refute_enqueued_fails_on_a_matching_job_only(jobs: Jobs, session: Session) -> None:
    testing.refute_enqueued(session, "send_invoice")
    jobs.enqueue(session, Invoice(invoice_id=8))
    testing.refute_enqueued(session, Invoice, jobs=jobs, invoice_id=9)
    with pytest.raises(AssertionError, match=r"send_invoice\(invoice_id=8\) was enqueued"):
        testing.refute_enqueued(session, Invoice, jobs=jobs, invoice_id=8)


def test_the_async_twins_see_and_run_the_async_sessions_jobs(
    clean: Engine, migrated_url: str, jobs: Jobs, ran: list[int]
) -> None:
    _left_by_another_test(clean, jobs, 40)

    async def scenario() -> None:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        async with AsyncSession(engine) as session, session.begin():
            await jobs.enqueue_async(session, Invoice(invoice_id=1))
            assert len(await testing.enqueued_async(session, "send_invoice")) == 1
            # enqueued itself takes an AsyncSession too, and returns an awaitable
            assert [j.kind for j in await testing.enqueued(session)] == ["send_invoice"]
            await testing.assert_enqueued_async(session, Invoice, jobs=jobs, invoice_id=1)
            await testing.refute_enqueued_async(session, Invoice, jobs=jobs, invoice_id=40)
            assert (await testing.run_jobs_async(jobs, session)).done == 1
            assert await testing.enqueued_async(session) == []
            await session.rollback()
        await engine.dispose()

    asyncio.run(scenario())
    assert ran == [1]


def test_run_jobs_async_records_durable_steps_of_an_async_handler(
    migrated_url: str, clean: Engine
) -> None:
    """``ctx.astep`` records from a thread: the record still runs on the test's transaction."""
    jobs = Jobs()
    calls: list[str] = []

    @jobs.kind("stepped", Ping)
    async def stepped(args: Ping, ctx: JobContext) -> None:
        await ctx.astep("one", lambda: calls.append("one") or 1)
        if ctx.attempt == 1:
            raise RuntimeError("after the step")

    async def scenario() -> None:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        async with AsyncSession(engine) as session, session.begin():
            await jobs.enqueue_async(session, Ping(n=1))
            result = await testing.run_jobs_async(jobs, session, raise_errors=False)
            assert result.failed == 1
            steps = await session.scalar(text("SELECT steps FROM sqla_jobs_job"))
            assert steps == {"one": 1}
            again = await testing.run_jobs_async(jobs, session, until=timedelta(hours=1))
            assert again.done == 1
            await session.rollback()
        await engine.dispose()

    asyncio.run(scenario())
    assert calls == ["one"]
