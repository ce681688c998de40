"""Enqueueing on a database that was never migrated raises the library's own error, naming what to
run, and says the transaction is aborted; no SQL dumped, no catalog probe on the enqueue path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError, InternalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_jobs import Jobs, NotMigratedError
from sqla_jobs.db.preflight import missing_queue_table
from sqla_jobs.db.urls import sqlalchemy_url
from tests.conftest import create_database, drop_database


class Ping(BaseModel):
    n: int = 0


class Once(BaseModel):
    n: int = 0


@pytest.fixture
def bare(server_url: str) -> Iterator[Engine]:
    """An engine on a database of its own where sqla-jobs' migrations never ran."""
    url = create_database(server_url, prefix="sqla_jobs_bare")
    engine = create_engine(sqlalchemy_url(url))
    try:
        yield engine
    finally:
        engine.dispose()
        drop_database(server_url, url)


def _jobs(schema: str | None = None) -> Jobs:
    jobs = Jobs(schema=schema)
    jobs.kind("ping", Ping)(lambda args, ctx: None)
    jobs.kind("once", Once, unique=True)(lambda args, ctx: None)
    return jobs


def _assert_said(exc: NotMigratedError, schema: str | None = None) -> None:
    said = str(exc)
    assert "no table sqla_jobs_job" in said
    assert "aborted" in said
    assert "roll it back" in said
    if schema is None:
        assert "alembic upgrade heads" in said
        assert "sqla-jobs migrate" in said
    else:
        assert f"sqla-jobs migrate --schema {schema}" in said
    assert "INSERT" not in said
    assert "[SQL:" not in said
    assert isinstance(exc.__cause__, Exception)  # the driver's error, kept for the traceback


@pytest.mark.parametrize("call", ["enqueue", "unique", "enqueue_many", "copy"])
def test_an_enqueue_on_a_database_never_migrated_names_the_migration_and_the_aborted_transaction(
    bare: Engine, call: str
) -> None:
    jobs = _jobs()
    calls: dict[str, Callable[[Session], object]] = {
        "enqueue": lambda s: jobs.enqueue(s, Ping()),
        "unique": lambda s: jobs.enqueue(s, Once()),
        "enqueue_many": lambda s: jobs.enqueue_many(s, [Ping(n=i) for i in range(3)]),
        "copy": lambda s: jobs.enqueue_many(s, [Ping(n=i) for i in range(5000)]),
    }
    with Session(bare) as session, session.begin():
        with pytest.raises(NotMigratedError) as raised:
            calls[call](session)
        _assert_said(raised.value)
        # As said: the transaction is aborted, the caller's next statement is refused.
        with pytest.raises(InternalError, match="current transaction is aborted"):
            session.execute(text("SELECT 1"))
        session.rollback()


def test_a_jobs_schema_that_was_never_migrated_names_its_own_migration(bare: Engine) -> None:
    with bare.begin() as conn:
        conn.execute(text("CREATE SCHEMA queue"))
    jobs = _jobs(schema="queue")
    with Session(bare) as session, session.begin():
        with pytest.raises(NotMigratedError) as raised:
            jobs.enqueue(session, Ping())
        _assert_said(raised.value, schema="queue")
        session.rollback()


def test_an_async_enqueue_on_a_database_never_migrated_says_the_same(bare: Engine) -> None:
    jobs = _jobs()
    url = bare.url.set(drivername="postgresql+psycopg")

    async def main() -> None:
        engine = create_async_engine(url)
        try:
            async with AsyncSession(engine) as session, session.begin():
                with pytest.raises(NotMigratedError) as raised:
                    await jobs.enqueue_async(session, Ping())
                _assert_said(raised.value)
                await session.rollback()
        finally:
            await engine.dispose()

    asyncio.run(main())


def test_another_missing_table_is_the_drivers_error_unchanged(bare: Engine) -> None:
    """Only sqla-jobs' own tables are translated: the application's mistakes stay its own."""
    with Session(bare) as session, session.begin():
        with pytest.raises(Exception, match='relation "orders" does not exist') as raised:
            session.execute(text("INSERT INTO orders VALUES (1)"))
        assert not isinstance(raised.value, NotMigratedError)
        session.rollback()


def test_a_missing_application_table_in_a_statement_naming_the_queue_is_not_taken_for_it(
    migrated_url: str,
) -> None:
    """The server's message names the relation it misses; the statement it quotes may name
    sqla-jobs' tables whatever is missing (a trigger's, a join): only the former counts."""
    engine = create_engine(sqlalchemy_url(migrated_url))
    try:
        with engine.connect() as conn:
            with pytest.raises(ProgrammingError) as raised:
                conn.execute(text("SELECT 1 FROM sqla_jobs_job, app_orders"))
            assert "sqla_jobs_job" in str(raised.value.orig)  # the statement, quoted
            assert missing_queue_table(raised.value, None) is None
    finally:
        engine.dispose()


def test_any_other_database_error_of_an_enqueue_keeps_its_own_cause(
    migrated_url: str,
) -> None:
    """Not translated, and not re-chained: the driver's error stays the wrapper's cause."""
    engine = create_engine(sqlalchemy_url(migrated_url))
    jobs = _jobs()
    try:
        with Session(engine) as session, session.begin():
            # A trigger of this transaction only (rolled back with it) refuses the INSERT.
            session.execute(
                text(
                    "CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$"
                )
            )
            session.execute(
                text(
                    "CREATE TRIGGER refuse BEFORE INSERT ON sqla_jobs_job "
                    "FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse()"
                )
            )
            with pytest.raises(DBAPIError, match="refused by a trigger") as raised:
                jobs.enqueue(session, Ping())
            session.rollback()
    finally:
        engine.dispose()
    assert raised.value.__cause__ is raised.value.orig
