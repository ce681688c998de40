"""The pytest plugin, end to end: a user's own test suite, run by pytest in a subprocess, uses the
``sqla_jobs_*`` fixtures; its handlers see the rows its tests wrote, and nothing is left behind."""

from __future__ import annotations

import importlib.metadata
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from sqla_jobs.db.urls import sqlalchemy_url

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent.parent
#: Options of the suites that need no async runner: an installed pytest-asyncio would warn, as
#: errors, that their configuration does not set its options.
QUIET = ("-p", "no:cacheprovider", "-p", "no:asyncio")

#: The user's application: a table of their own, a handler that takes the session, and one that
#: opens its own from the application's sessionmaker.
APP = """
from pydantic import BaseModel
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from sqla_jobs import JobContext, Jobs

SessionLocal = sessionmaker()  # bound to the real engine at startup
jobs = Jobs()


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "plugin_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str]


class ShipOrder(BaseModel):
    order_id: int


class RemindCustomer(BaseModel):
    order_id: int


@jobs.kind("ship_order", ShipOrder)
def ship_order(payload: ShipOrder, ctx: JobContext, session: Session) -> None:
    order = session.get(Order, payload.order_id)
    if order is None:
        raise LookupError(f"order {payload.order_id} not found")
    order.status = "shipped"


@jobs.kind("remind_customer", RemindCustomer)
def remind_customer(payload: RemindCustomer, ctx: JobContext) -> None:
    with SessionLocal.begin() as session:
        order = session.get(Order, payload.order_id)
        if order is None:
            raise LookupError(f"order {payload.order_id} not found")
        order.status = "reminded"


def checkout(session: Session, order_id: int) -> None:
    session.add(Order(id=order_id, status="paid"))
    jobs.enqueue(session, ShipOrder(order_id=order_id))
    session.commit()
"""

#: The user's conftest.py: their tables, and their sessionmaker swapped for the plugin's.
CONFTEST = """
import pytest

import shop


@pytest.fixture(scope="session", autouse=True)
def tables(sqla_jobs_engine):
    shop.Base.metadata.create_all(sqla_jobs_engine)


@pytest.fixture(autouse=True)
def app_sessions(monkeypatch, sqla_jobs_sessionmaker):
    monkeypatch.setattr(shop, "SessionLocal", sqla_jobs_sessionmaker)
"""

TESTS = """
from datetime import timedelta

from sqlalchemy import select

from sqla_jobs import testing
from shop import Order, RemindCustomer, ShipOrder, checkout, jobs


def test_shipping_marks_the_order_shipped(sqla_jobs_session):
    checkout(sqla_jobs_session, order_id=8)
    testing.assert_enqueued(sqla_jobs_session, ShipOrder, jobs=jobs, order_id=8)
    assert testing.run_jobs(jobs, sqla_jobs_session).done == 1
    order = sqla_jobs_session.get(Order, 8)
    assert order.status == "shipped"


def test_a_reminder_a_day_later_opens_its_own_session(sqla_jobs_session):
    checkout(sqla_jobs_session, order_id=9)
    testing.run_jobs(jobs, sqla_jobs_session)
    jobs.enqueue(sqla_jobs_session, RemindCustomer(order_id=9), delay=timedelta(days=1))
    assert testing.run_jobs(jobs, sqla_jobs_session).done == 0
    assert testing.run_jobs(jobs, sqla_jobs_session, until=timedelta(days=1)).done == 1
    assert sqla_jobs_session.scalar(select(Order.status).where(Order.id == 9)) == "reminded"
    testing.refute_enqueued(sqla_jobs_session, "remind_customer")


def test_a_chain_runs_in_order_in_one_call(sqla_jobs_session):
    sqla_jobs_session.add(Order(id=10, status="paid"))
    jobs.chain(sqla_jobs_session, [ShipOrder(order_id=10), RemindCustomer(order_id=10)])
    sqla_jobs_session.commit()
    assert testing.run_jobs(jobs, sqla_jobs_session).done == 2
    assert sqla_jobs_session.scalar(select(Order.status).where(Order.id == 10)) == "reminded"
"""


def _plugin_args() -> list[str]:
    """Nothing, when the installed package declares the entry point (the path users take);
    else the plugin by name (a checkout installed before the entry point was added)."""
    eps = importlib.metadata.entry_points(group="pytest11")
    if any(ep.name == "sqla_jobs" for ep in eps):
        return []
    return ["-p", "sqla_jobs.pytest_plugin"]


def _assert_nothing_left(url: str) -> None:
    """The user's suite rolled everything back: their rows, and the jobs."""
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            tables = ("plugin_orders", "sqla_jobs_job", "sqla_jobs_dependency", "sqla_jobs_outcome")
            for table in tables:
                left = conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
                assert left == 0, f"{left} rows left in {table}"
    finally:
        engine.dispose()


@pytest.fixture
def user_db(migrated_url: str, clean: Engine) -> Iterator[str]:
    """The test database the user's suite runs against; their table dropped afterwards."""
    yield migrated_url
    with clean.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS plugin_orders"))


def test_a_users_suite_sees_its_rows_in_handlers_and_leaves_nothing_behind(
    pytester: pytest.Pytester, user_db: str, clean: Engine
) -> None:
    pytester.makepyfile(shop=APP, conftest=CONFTEST, test_shop=TESTS)
    pytester.makeini(
        textwrap.dedent(
            f"""
            [pytest]
            sqla_jobs_database_url = {sqlalchemy_url(user_db)}
            filterwarnings = error
            """
        )
    )
    result = pytester.runpytest_subprocess(*_plugin_args(), *QUIET)
    result.assert_outcomes(passed=3)
    _assert_nothing_left(user_db)


ASYNC_APP = """
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from sqla_jobs import JobContext, Jobs
from shop import Order

jobs = Jobs()


class ShipOrder(BaseModel):
    order_id: int


@jobs.kind("ship_order", ShipOrder)
async def ship_order(payload: ShipOrder, ctx: JobContext, session: AsyncSession) -> None:
    order = await session.get(Order, payload.order_id)
    if order is None:
        raise LookupError(f"order {payload.order_id} not found")
    order.status = "shipped"
"""

ASYNC_TESTS = """
import pytest
from sqlalchemy import select

from sqla_jobs import testing
from ashop import ShipOrder, jobs
from shop import Order


@pytest.mark.asyncio
async def test_shipping_marks_the_order_shipped(sqla_jobs_async_session):
    session = sqla_jobs_async_session
    session.add(Order(id=8, status="paid"))
    await jobs.enqueue_async(session, ShipOrder(order_id=8))
    await session.commit()
    await testing.assert_enqueued_async(session, ShipOrder, jobs=jobs, order_id=8)
    assert (await testing.run_jobs_async(jobs, session)).done == 1
    assert await session.scalar(select(Order.status).where(Order.id == 8)) == "shipped"
"""


def test_the_async_fixtures_under_pytest_asyncio(
    pytester: pytest.Pytester, user_db: str, clean: Engine
) -> None:
    pytest.importorskip("pytest_asyncio")
    pytester.makepyfile(shop=APP, ashop=ASYNC_APP, conftest=CONFTEST, test_ashop=ASYNC_TESTS)
    pytester.makeini(
        textwrap.dedent(
            f"""
            [pytest]
            sqla_jobs_database_url = {sqlalchemy_url(user_db)}
            asyncio_mode = strict
            asyncio_default_fixture_loop_scope = function
            filterwarnings = error
            """
        )
    )
    result = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    _assert_nothing_left(user_db)


def test_without_a_database_the_fixtures_say_how_to_configure_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    pytester.makepyfile("def test_it(sqla_jobs_session):\n    pass\n")
    result = pytester.runpytest_inprocess(*_plugin_args(), *QUIET)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*set DATABASE_URL, or sqla_jobs_database_url*"])


def test_the_package_declares_the_plugin_entry_point() -> None:
    """What makes pytest load the plugin without a ``-p`` or ``pytest_plugins`` of the user's."""
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '[project.entry-points.pytest11]\nsqla_jobs = "sqla_jobs.pytest_plugin"' in pyproject
