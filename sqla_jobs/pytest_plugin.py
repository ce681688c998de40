"""The pytest plugin (entry point ``sqla_jobs``): each test in a transaction rolled back at its end,
which the sessions of your code and of your handlers join.

SQLAlchemy's recipe "Joining a Session into an External Transaction": one connection per test,
an outer transaction begun on it and rolled back at teardown, and sessions bound to that connection
with ``join_transaction_mode="create_savepoint"``, so that your code's ``commit()`` and
``rollback()`` only release or roll back a SAVEPOINT. :func:`sqla_jobs.testing.run_jobs` joins the
same transaction, so a handler sees the rows the test wrote, and nothing is left behind.

Fixtures (override any of them in your ``conftest.py``):

- ``sqla_jobs_database_url`` (session): the ``sqla_jobs_database_url`` ini option, else
  ``$DATABASE_URL``. The database must be migrated (``alembic upgrade heads`` or
  ``sqla-jobs migrate``).
- ``sqla_jobs_engine`` (session): an ``Engine`` on it; override it to use your own.
- ``sqla_jobs_connection``: the test's connection, inside the outer transaction.
- ``sqla_jobs_session``: a ``Session`` joined to it.
- ``sqla_jobs_sessionmaker``: a ``sessionmaker`` making such sessions, to put in place of your
  application's own (``monkeypatch.setattr(myapp.db, "Session", sqla_jobs_sessionmaker)``).
- ``sqla_jobs_async_engine`` (session), and the async twins ``sqla_jobs_async_connection``,
  ``sqla_jobs_async_session`` (``expire_on_commit=False``) and ``sqla_jobs_async_sessionmaker``:
  these need an async test runner, pytest-asyncio (strict or auto mode) or anyio.
"""

from __future__ import annotations

import importlib
import os
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

# SQLAlchemy is imported inside the fixtures: an installed plugin loads in every pytest run of the
# environment, most of which never ask for these fixtures.
if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.ext.asyncio import (
        AsyncConnection,
        AsyncEngine,
        AsyncSession,
        async_sessionmaker,
    )
    from sqlalchemy.orm import Session, sessionmaker

INI_URL = "sqla_jobs_database_url"
_F = TypeVar("_F", bound=Callable[..., Any])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI_URL,
        "PostgreSQL URL of the migrated test database of the sqla_jobs_* fixtures "
        "(default: $DATABASE_URL)",
    )


def _async_fixture(fn: _F) -> _F:
    # pytest-asyncio in strict mode (its default) runs only the async fixtures it marked itself;
    # without it, a plain fixture is what anyio (or pytest-asyncio's auto mode) runs.
    try:
        module = importlib.import_module("pytest_asyncio")
    except ImportError:
        return typing.cast(_F, pytest.fixture(fn))
    return typing.cast(_F, module.fixture(fn))


@pytest.fixture(scope="session")
def sqla_jobs_database_url(pytestconfig: pytest.Config) -> str:
    """The test database's URL: the ``sqla_jobs_database_url`` ini option, else
    ``$DATABASE_URL``."""
    url = str(pytestconfig.getini(INI_URL) or os.environ.get("DATABASE_URL") or "")
    if not url:
        pytest.fail(
            "the sqla_jobs fixtures need a migrated test database: set DATABASE_URL, or "
            f"{INI_URL} in your pytest configuration, or override the sqla_jobs_engine fixture "
            "in your conftest.py",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def sqla_jobs_engine(sqla_jobs_database_url: str) -> Iterator[Engine]:
    """An ``Engine`` on the test database (psycopg 3, whatever driver the URL names), disposed
    at the end of the session."""
    from sqlalchemy import create_engine

    from sqla_jobs.db.urls import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(sqla_jobs_database_url))
    yield engine
    engine.dispose()


@pytest.fixture
def sqla_jobs_connection(sqla_jobs_engine: Engine) -> Iterator[Connection]:
    """The test's connection, in an outer transaction rolled back when the test ends: whatever
    the test and its handlers write, committed or not, is gone. Commit the sessions bound to it,
    never the connection itself."""
    with sqla_jobs_engine.connect() as connection:
        outer = connection.begin()
        try:
            yield connection
        finally:
            if outer.is_active:
                outer.rollback()


@pytest.fixture
def sqla_jobs_session(sqla_jobs_connection: Connection) -> Iterator[Session]:
    """A ``Session`` joined to the test's transaction: its ``commit()`` releases a SAVEPOINT and
    its ``rollback()`` rolls back to one; the outer transaction is rolled back at teardown."""
    from sqlalchemy.orm import Session

    with Session(bind=sqla_jobs_connection, join_transaction_mode="create_savepoint") as session:
        yield session


@pytest.fixture
def sqla_jobs_sessionmaker(sqla_jobs_connection: Connection) -> sessionmaker[Session]:
    """A ``sessionmaker`` whose sessions join the test's transaction as
    ``sqla_jobs_session`` does: put it in place of your application's, so that code opening its
    own sessions (a handler that does not take one) sees the test's rows."""
    from sqlalchemy.orm import Session, sessionmaker

    return sessionmaker(
        bind=sqla_jobs_connection, class_=Session, join_transaction_mode="create_savepoint"
    )


@pytest.fixture(scope="session")
def sqla_jobs_async_engine(sqla_jobs_engine: Engine) -> Iterator[AsyncEngine]:
    """An ``AsyncEngine`` (psycopg 3) on ``sqla_jobs_engine``'s database, without a pool: each
    test opens its connection on its own event loop, where a pooled one from an earlier test's
    loop could not be used."""
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    from sqla_jobs.db.urls import sqlalchemy_url

    url = sqlalchemy_url(sqla_jobs_engine.url.render_as_string(hide_password=False))
    engine = create_async_engine(url, poolclass=NullPool)
    yield engine
    engine.sync_engine.dispose()  # nothing pooled: no loop needed


@_async_fixture
async def sqla_jobs_async_connection(
    sqla_jobs_async_engine: AsyncEngine,
) -> AsyncIterator[AsyncConnection]:
    """``sqla_jobs_connection`` for async tests: an ``AsyncConnection`` in an outer transaction
    rolled back when the test ends."""
    async with sqla_jobs_async_engine.connect() as connection:
        outer = await connection.begin()
        try:
            yield connection
        finally:
            if outer.is_active:
                await outer.rollback()


@_async_fixture
async def sqla_jobs_async_session(
    sqla_jobs_async_connection: AsyncConnection,
) -> AsyncIterator[AsyncSession]:
    """``sqla_jobs_session`` for async tests: an ``AsyncSession`` joined to the test's
    transaction, with ``expire_on_commit=False`` (an expired attribute cannot load lazily)."""
    from sqlalchemy.ext.asyncio import AsyncSession

    async with AsyncSession(
        bind=sqla_jobs_async_connection,
        join_transaction_mode="create_savepoint",
        expire_on_commit=False,
    ) as session:
        yield session


@pytest.fixture
def sqla_jobs_async_sessionmaker(
    sqla_jobs_async_connection: AsyncConnection,
) -> async_sessionmaker[AsyncSession]:
    """``sqla_jobs_sessionmaker`` for async code: an ``async_sessionmaker`` whose sessions join
    the test's transaction."""
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    return async_sessionmaker(
        bind=sqla_jobs_async_connection,
        class_=AsyncSession,
        join_transaction_mode="create_savepoint",
        expire_on_commit=False,
    )
