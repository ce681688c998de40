"""The single enqueue's INSERT goes straight to psycopg's cursor when nothing would see it go
through ``Connection.execute`` (:mod:`sqla_jobs.db.direct`): here, what that path must keep. An
event listener, a dialect hook or ``echo`` still sees the INSERT; an error is SQLAlchemy's, a lost
connection is invalidated; a ``schema_translate_map`` on the engine still places the job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import Jobs
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
from tests.conftest import migrated_schema
from tests.integration._listening import ARRIVES, Heard


class Ping(BaseModel):
    n: int


JOBS = Jobs()
JOBS.register("ping", Ping)
SCHEMA = "sqla_jobs_direct"


def job_ids(engine: Engine, schema: str | None = None) -> list[int]:
    table = "sqla_jobs_job" if schema is None else f'"{schema}".sqla_jobs_job'
    with engine.connect() as conn:
        return list(conn.scalars(text(f"SELECT id FROM {table} ORDER BY id")))


@pytest.fixture
def executed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements that went through ``Connection.execute`` (compiled for PostgreSQL)."""
    seen: list[str] = []
    real = Connection.execute

    def spy(self: Connection, statement: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(statement.compile(dialect=self.dialect)))
        return real(self, statement, *args, **kwargs)

    monkeypatch.setattr(Connection, "execute", spy)
    return seen


def inserts(statements: list[str]) -> list[str]:
    return [s for s in statements if "INSERT INTO" in s]


def kill_backend(url: str, pid: int) -> None:
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


def enqueue_one(engine: Engine, jobs: Jobs = JOBS) -> int:
    """Enqueue one job in a Session transaction of its own on ``engine``, committed; its id."""
    with Session(engine) as session:
        job_id = jobs.enqueue(session, Ping(n=1)).id
        session.commit()
    return job_id


@pytest.fixture
def fresh(clean: Engine, migrated_url: str) -> Iterator[Engine]:
    """An engine of its own: once a listener was added to an engine (the suite's shared one,
    by other tests), SQLAlchemy counts it as listened to for good."""
    engine = create_engine(sqlalchemy_url(migrated_url), pool_size=1)
    yield engine
    engine.dispose()


def test_with_nothing_listening_the_insert_does_not_go_through_connection_execute(
    clean: Engine, fresh: Engine, executed: list[str]
) -> None:
    job_id = enqueue_one(fresh)
    assert inserts(executed) == []
    assert job_ids(clean) == [job_id]


def _engine_event(engine: Engine, seen: list[str]) -> None:
    event.listen(engine, "before_cursor_execute", lambda c, cur, stmt, *a: seen.append(stmt))


def _dialect_event(engine: Engine, seen: list[str]) -> None:
    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        seen.append(statement)
        return False  # the dialect executes it, as without the hook

    event.listen(engine.dialect, "do_execute", do_execute)


@pytest.mark.parametrize("observer", [_engine_event, _dialect_event], ids=["engine", "dialect"])
def test_a_listener_sees_the_insert(
    clean: Engine, migrated_url: str, observer: Callable[[Engine, list[str]], None]
) -> None:
    engine = create_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
    seen: list[str] = []
    observer(engine, seen)
    try:
        job_id = enqueue_one(engine)
    finally:
        engine.dispose()
    assert len(inserts(seen)) == 1
    assert job_ids(clean) == [job_id]


def test_an_echoing_engine_logs_the_insert(
    clean: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(sqlalchemy_url(migrated_url), poolclass=NullPool, echo=True)
    try:
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"), Session(engine) as session:
            JOBS.enqueue(session, Ping(n=1))
            session.commit()
    finally:
        engine.dispose()
    assert len(inserts([r.getMessage() for r in caplog.records])) == 1


def test_a_row_the_database_refuses_raises_sqlalchemys_error_and_the_session_goes_on(
    clean: Engine, fresh: Engine, executed: list[str]
) -> None:
    with clean.begin() as conn:
        conn.execute(
            text(
                "ALTER TABLE sqla_jobs_job ADD CONSTRAINT no_thirteen "
                "CHECK (payload->>'n' IS DISTINCT FROM '13')"
            )
        )
    try:
        with Session(fresh) as session:
            with pytest.raises(sa_exc.IntegrityError, match="no_thirteen"):
                JOBS.enqueue(session, Ping(n=13))
            session.rollback()
            kept = JOBS.enqueue(session, Ping(n=14)).id
            session.commit()
    finally:
        with clean.begin() as conn:
            conn.execute(text("ALTER TABLE sqla_jobs_job DROP CONSTRAINT no_thirteen"))
    assert inserts(executed) == []
    assert job_ids(clean) == [kept]


def _kill_on_the_server(session: Session, url: str) -> None:
    kill_backend(url, session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _close_under_the_session(session: Session, url: str) -> None:
    # psycopg then refuses the cursor itself, before any statement.
    session.connection().connection.driver_connection.close()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "lose", [_kill_on_the_server, _close_under_the_session], ids=["killed", "closed"]
)
def test_a_lost_connection_is_sqlalchemys_disconnect_error_and_not_reused(
    clean: Engine,
    fresh: Engine,
    migrated_url: str,
    executed: list[str],
    lose: Callable[[Session, str], None],
) -> None:
    with Session(fresh) as session:
        conn = session.connection()
        lose(session, migrated_url)
        with pytest.raises(sa_exc.DBAPIError) as lost:
            JOBS.enqueue(session, Ping(n=1))
        assert lost.value.connection_invalidated
        assert conn.invalidated
        session.rollback()
    with Session(fresh) as session:
        kept = JOBS.enqueue(session, Ping(n=2)).id
        session.commit()
    assert inserts(executed) == []
    assert job_ids(clean) == [kept]


def test_a_listener_on_the_sessions_connection_sees_the_insert(
    clean: Engine, fresh: Engine
) -> None:
    seen: list[str] = []
    with Session(fresh) as session:
        conn = session.connection()
        event.listen(conn, "before_cursor_execute", lambda c, cur, stmt, *a: seen.append(stmt))
        job_id = JOBS.enqueue(session, Ping(n=1)).id
        session.commit()
    assert len(inserts(seen)) == 1
    assert job_ids(clean) == [job_id]


def test_the_insert_with_its_notify_folded_in_goes_straight_to_the_driver_too(
    clean: Engine, fresh: Engine, executed: list[str], heard: Heard
) -> None:
    jobs = Jobs(wakeup="in_transaction")
    jobs.register("ping", Ping)
    job_id = enqueue_one(fresh, jobs)
    assert inserts(executed) == []
    assert job_ids(clean) == [job_id]
    assert heard.within(ARRIVES) == ["default"]


def test_an_async_enqueue_goes_direct_and_a_lost_connection_is_not_reused(
    clean: Engine, migrated_url: str, executed: list[str]
) -> None:
    async def scenario() -> int:
        engine = create_async_engine(sqlalchemy_url(migrated_url), pool_size=1)
        try:
            async with AsyncSession(engine) as session:
                pid = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                kill_backend(migrated_url, pid)
                with pytest.raises(sa_exc.OperationalError) as lost:
                    await JOBS.enqueue_async(session, Ping(n=1))
                assert lost.value.connection_invalidated
                await session.rollback()
            async with AsyncSession(engine) as session:
                job_id = (await JOBS.enqueue_async(session, Ping(n=2))).id
                await session.commit()
                return job_id
        finally:
            await engine.dispose()

    kept = asyncio.run(scenario())
    assert inserts(executed) == []
    assert job_ids(clean) == [kept]


@pytest.fixture
def schema(clean: Engine, migrated_url: str) -> Iterator[str]:
    with migrated_schema(clean, migrated_url, SCHEMA) as made:
        yield made


def test_an_engines_schema_translate_map_still_places_the_job(
    clean: Engine, migrated_url: str, schema: str
) -> None:
    engine = create_engine(sqlalchemy_url(migrated_url), poolclass=NullPool).execution_options(
        schema_translate_map={None: schema}
    )
    try:
        job_id = enqueue_one(engine)
    finally:
        engine.dispose()
    assert job_ids(clean, schema) == [job_id]
    assert job_ids(clean) == []


def test_a_schema_jobs_inserts_into_its_schema(
    clean: Engine, fresh: Engine, schema: str, executed: list[str]
) -> None:
    jobs = Jobs(schema=schema)
    jobs.register("ping", Ping)
    job_id = enqueue_one(fresh, jobs)
    assert inserts(executed) == []
    assert job_ids(clean, schema) == [job_id]
    assert job_ids(clean) == []
