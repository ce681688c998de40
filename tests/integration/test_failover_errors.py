"""The errors a real server raises when a connection is lost or its server is not the primary,
and :func:`sqla_jobs.failover_safe` on an application's engine.

A demoted server is played by a session made read-only (``default_transaction_read_only``, set on
that session alone: the shared server's settings are never changed); the errors only a standby
raises are raised by the server with their SQLSTATE and message (the failover harness meets the
real ones).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from sqla_jobs import failover_safe
from sqla_jobs.db.failover import _mark_disconnect, is_lost
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url


@pytest.fixture
def conn(migrated_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as made:
        yield made


def _raised(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(statement)
    return info.value


def test_a_write_on_a_read_only_server_is_a_lost_connection(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    conn.execute("SET default_transaction_read_only = on")
    exc = _raised(conn, "CREATE TABLE demoted (id int)")
    assert exc.sqlstate == "25006"
    assert is_lost(exc)


def test_a_terminated_session_is_a_lost_connection(
    conn: psycopg.Connection[tuple[object, ...]], migrated_url: str
) -> None:
    pid = conn.info.backend_pid
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    exc = _raised(conn, "SELECT 1")
    assert is_lost(exc), f"{type(exc).__name__} {exc.sqlstate}: {exc}"
    # And the connection, closed now, says so on its next use.
    assert is_lost(_raised(conn, "SELECT 1"))


def test_a_refused_connection_is_a_lost_connection() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(f"host=127.0.0.1 port={port} connect_timeout=5")
    assert is_lost(info.value)


@pytest.mark.parametrize(
    ("sqlstate", "message"),
    [
        ("25006", "cannot execute LISTEN during recovery"),
        ("0A000", "cannot set transaction read-write mode during recovery"),
        ("55000", "recovery is in progress"),
        ("57P03", "the database system is not yet accepting connections"),
    ],
)
def test_what_a_standby_refuses_is_a_lost_connection(
    conn: psycopg.Connection[tuple[object, ...]], sqlstate: str, message: str
) -> None:
    exc = _raised(
        conn, f"DO $$ BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = '{sqlstate}'; END $$"
    )
    assert exc.sqlstate == sqlstate
    assert is_lost(exc)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 1 / 0",
        "SET lock_timeout = 'x'",
        "DO $$ BEGIN RAISE EXCEPTION 'cannot use a cursor here' USING ERRCODE = '0A000'; END $$",
    ],
)
def test_an_error_a_new_connection_would_not_cure_is_not_a_lost_connection(
    conn: psycopg.Connection[tuple[object, ...]], statement: str
) -> None:
    assert not is_lost(_raised(conn, statement))


def _pid(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _demote_pooled_connection(engine: Engine) -> int:
    """Make the pool's connection read-only (a server demoted under it); its pid."""
    with engine.connect() as c:
        c.execute(text("SET SESSION default_transaction_read_only = on"))
        c.commit()
        return int(c.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _write(engine: Engine) -> None:
    with engine.begin() as c:
        c.execute(text("CREATE TEMP TABLE written (id int)"))


def test_a_failover_safe_engine_drops_a_connection_to_a_demoted_server(migrated_url: str) -> None:
    engine = failover_safe(create_engine(sqlalchemy_url(migrated_url), pool_size=1))
    try:
        demoted = _demote_pooled_connection(engine)
        with pytest.raises(DBAPIError) as info:
            _write(engine)
        assert info.value.connection_invalidated
        assert _pid(engine) != demoted
        _write(engine)  # the fresh connection takes writes
    finally:
        engine.dispose()


def test_a_plain_engine_keeps_its_connection_to_a_demoted_server(migrated_url: str) -> None:
    """What failover_safe is for: without it, the pool hands the demoted connection out again."""
    engine = create_engine(sqlalchemy_url(migrated_url), pool_size=1, pool_pre_ping=True)
    try:
        demoted = _demote_pooled_connection(engine)
        with pytest.raises(DBAPIError) as info:
            _write(engine)
        assert not info.value.connection_invalidated
        assert _pid(engine) == demoted
    finally:
        engine.dispose()


def test_failover_safe_takes_an_async_engine_and_adds_one_listener(migrated_url: str) -> None:
    engine = create_async_engine(sqlalchemy_url(migrated_url))
    assert failover_safe(failover_safe(engine)) is engine
    assert event.contains(engine.sync_engine, "handle_error", _mark_disconnect)
