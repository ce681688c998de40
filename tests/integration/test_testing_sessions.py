"""``testing.run_jobs`` gives a handler that takes a session one joined to the test's transaction
by a SAVEPOINT: it sees the test's rows, and its writes and its job's completion are released
together or rolled back together, as the worker commits or rolls back both."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import NullPool

from sqla_jobs import ConfigurationError, JobContext, Jobs, LeaseLostError, StepError, testing
from sqla_jobs.db.urls import sqlalchemy_url


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "testing_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str]


class Ship(BaseModel):
    order_id: int


class Ping(BaseModel):
    n: int


class Failing(BaseModel):
    order_id: int


def ship(session: Session, order_id: int) -> None:
    order = session.get(Order, order_id)
    if order is None:
        raise LookupError(f"order {order_id} not found")
    order.status = "shipped"


@pytest.fixture
def conn(clean: Engine) -> Iterator[Connection]:
    """The test's connection, in a transaction rolled back at the end (the orders table too)."""
    with clean.connect() as connection:
        outer = connection.begin()
        Base.metadata.create_all(connection)
        yield connection
        outer.rollback()


@pytest.fixture
def session(conn: Connection) -> Iterator[Session]:
    with Session(bind=conn, join_transaction_mode="create_savepoint") as s:
        yield s


def _job_row(session: Session) -> tuple[str, int]:
    row = session.execute(text("SELECT state, attempts FROM sqla_jobs_job")).one()
    return row[0], row[1]


def test_a_session_handler_sees_the_tests_rows_and_its_writes_show_in_the_test(
    session: Session,
) -> None:
    jobs = Jobs()

    @jobs.kind("ship", Ship)
    def handler(args: Ship, ctx: JobContext, db: Session) -> None:
        ship(db, args.order_id)

    order = Order(id=8, status="paid")
    session.add(order)
    jobs.enqueue(session, Ship(order_id=8))
    assert testing.run_jobs(jobs, session).done == 1
    assert order.status == "shipped", "expired by run_jobs, as a commit would"
    assert testing.enqueued(session) == []


def test_a_failing_session_handler_rolls_back_its_writes_and_fails_the_job(
    session: Session,
) -> None:
    jobs = Jobs()

    @jobs.kind("ship", Ship)
    def handler(args: Ship, ctx: JobContext, db: Session) -> None:
        ship(db, args.order_id)
        db.flush()
        raise RuntimeError("the carrier is down")

    session.add(Order(id=8, status="paid"))
    jobs.enqueue(session, Ship(order_id=8))
    with pytest.raises(RuntimeError, match="the carrier is down"):
        testing.run_jobs(jobs, session)
    assert session.scalar(select(Order.status)) == "paid"
    assert _job_row(session) == ("pending", 1)


def test_a_snoozing_session_handler_rolls_back_its_writes(session: Session) -> None:
    jobs = Jobs()

    @jobs.kind("ship", Ship)
    def handler(args: Ship, ctx: JobContext, db: Session) -> None:
        ship(db, args.order_id)
        ctx.snooze(timedelta(minutes=5))

    session.add(Order(id=8, status="paid"))
    jobs.enqueue(session, Ship(order_id=8))
    assert testing.run_jobs(jobs, session).snoozed == 1
    assert session.scalar(select(Order.status)) == "paid"
    assert _job_row(session) == ("pending", 0)


def test_ctx_step_is_refused_in_a_handler_that_takes_a_session(session: Session) -> None:
    jobs = Jobs()

    @jobs.kind("ship", Ship)
    def handler(args: Ship, ctx: JobContext, db: Session) -> None:
        ship(db, args.order_id)
        ctx.step("label", lambda: "printed")

    session.add(Order(id=8, status="paid"))
    jobs.enqueue(session, Ship(order_id=8))
    result = testing.run_jobs(jobs, session, raise_errors=False)
    assert result.failed == 1
    assert isinstance(result.errors[0], StepError)
    assert "durable steps do not mix with a handler that takes a session" in str(result.errors[0])
    assert session.scalar(select(Order.status)) == "paid"
    assert session.scalar(text("SELECT steps FROM sqla_jobs_job")) is None


def test_a_session_handler_whose_lease_is_lost_rolls_back_and_writes_no_outcome(
    session: Session,
) -> None:
    """As in the worker: the completion's fence finds no row, so the handler's writes roll back,
    and the job, now another worker's, is left as that worker holds it."""
    jobs = Jobs()

    @jobs.kind("ship", Ship)
    def handler(args: Ship, ctx: JobContext, db: Session) -> None:
        ship(db, args.order_id)
        db.execute(text("UPDATE sqla_jobs_job SET lease_token = gen_random_uuid()"))

    session.add(Order(id=8, status="paid"))
    jobs.enqueue(session, Ship(order_id=8))
    result = testing.run_jobs(jobs, session, raise_errors=False)
    assert (result.done, result.failed) == (0, 0)
    assert isinstance(result.errors[0], LeaseLostError)
    assert session.scalar(select(Order.status)) == "paid"
    assert _job_row(session) == ("running", 1)


def test_a_plain_handler_opening_its_own_session_joins_the_tests_transaction(
    conn: Connection, session: Session
) -> None:
    """The application's sessionmaker, bound to the test's connection, sees the test's rows:
    with one bound to the engine the handler would fail with ``order 8 not found``."""
    app_sessions = sessionmaker(bind=conn, join_transaction_mode="create_savepoint")
    jobs = Jobs()

    @jobs.kind("ship", Ship)
    def handler(args: Ship, ctx: JobContext) -> None:
        with app_sessions() as db, db.begin():
            ship(db, args.order_id)

    session.add(Order(id=8, status="paid"))
    jobs.enqueue(session, Ship(order_id=8))
    assert testing.run_jobs(jobs, session).done == 1
    assert session.scalar(select(Order.status)) == "shipped"


def test_an_async_session_handler_needs_run_jobs_async(session: Session) -> None:
    jobs = Jobs()

    @jobs.kind("ship", Ship)
    async def handler(args: Ship, ctx: JobContext, db: AsyncSession) -> None:
        pass

    jobs.enqueue(session, Ship(order_id=8))
    with pytest.raises(ConfigurationError, match="run_jobs_async"):
        testing.run_jobs(jobs, session)


def test_run_jobs_async_gives_async_handlers_an_async_session_and_sync_ones_a_session(
    migrated_url: str, clean: Engine
) -> None:
    jobs = Jobs()
    given: list[type] = []

    @jobs.kind("ship", Ship)
    async def async_ship(args: Ship, ctx: JobContext, db: AsyncSession) -> None:
        given.append(type(db))
        order = await db.get(Order, args.order_id)
        assert order is not None, f"order {args.order_id} not found"
        order.status = "shipped"

    @jobs.kind("ship_sync", Ping)
    def sync_ship(args: Ping, ctx: JobContext, db: Session) -> None:
        given.append(type(db))
        ship(db, args.n)

    @jobs.kind("ship_failing", Failing)
    async def failing(args: Failing, ctx: JobContext, db: AsyncSession) -> None:
        order = await db.get(Order, args.order_id)
        assert order is not None
        order.status = "lost"
        await db.flush()
        raise RuntimeError("lost in transit")

    async def scenario() -> None:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        async with engine.connect() as connection:
            outer = await connection.begin()
            await connection.run_sync(Base.metadata.create_all)
            async with AsyncSession(
                bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
            ) as session:
                session.add_all([Order(id=8, status="paid"), Order(id=9, status="paid")])
                session.add(Order(id=10, status="paid"))
                await jobs.enqueue_async(session, Ship(order_id=8))
                await jobs.enqueue_async(session, Ping(n=9))
                await jobs.enqueue_async(session, Failing(order_id=10))
                result = await testing.run_jobs_async(jobs, session, raise_errors=False)
                assert (result.done, result.failed) == (2, 1)
                statuses = await session.execute(select(Order.id, Order.status).order_by(Order.id))
                assert statuses.all() == [(8, "shipped"), (9, "shipped"), (10, "paid")]
            await outer.rollback()
        await engine.dispose()

    asyncio.run(scenario())
    assert given == [AsyncSession, Session]
