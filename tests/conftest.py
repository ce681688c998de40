"""Shared fixtures: a real PostgreSQL, a throw-away database per test session, migrated once.

The server is ``DATABASE_URL`` when it is set, else an embedded PostgreSQL started for the session
and stopped at its end. Each session (each xdist worker, each checkout) creates its own database
with a random name and drops it when done, so runs never see each other.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from devdb import database_url
from sqla_jobs.db.urls import sqlalchemy_url, with_database

REPO = Path(__file__).resolve().parent.parent


def alembic_config(url: str) -> Config:
    """The repository's alembic.ini, pointed at ``url``."""
    cfg = Config(str(REPO / "alembic.ini"))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


@contextlib.contextmanager
def migrated_schema(engine: Engine, url: str, schema: str) -> Iterator[str]:
    """Schema ``schema`` made afresh on ``url``'s database (``engine``'s), the migrations run
    into it (their version table included); dropped afterwards."""
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        cfg = alembic_config(url)
        cfg.attributes["sqla_jobs_schema"] = schema
        command.upgrade(cfg, "head")
        yield schema
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


def create_database(server_url: str, prefix: str = "sqla_jobs_test") -> str:
    """Create a database with a unique name on the server; return its URL."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(
        sqlalchemy_url(server_url), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return with_database(server_url, name)


def drop_database(server_url: str, url: str) -> None:
    """Drop the database ``url`` names, disconnecting whoever is still in it."""
    name = create_engine(sqlalchemy_url(url)).url.database
    admin = create_engine(
        sqlalchemy_url(server_url), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of the PostgreSQL server under test (any database on it)."""
    with database_url() as url:
        yield url


@pytest.fixture(scope="session")
def db_url(server_url: str) -> Iterator[str]:
    """A fresh, empty database for this test session."""
    url = create_database(server_url)
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="session")
def migrated_url(db_url: str) -> str:
    """``db_url`` after ``alembic upgrade head``."""
    command.upgrade(alembic_config(db_url), "head")
    return db_url


@pytest.fixture(scope="session")
def engine(migrated_url: str) -> Iterator[Engine]:
    """An engine on the migrated database."""
    eng = create_engine(sqlalchemy_url(migrated_url))
    yield eng
    eng.dispose()


@pytest.fixture
def clean(engine: Engine) -> Engine:
    """The engine, with the job, history, paused-queue, schedule and worker tables emptied first: a
    queue paused, a schedule or a killed worker's row left by an earlier test on this database would
    change what this one sees."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE sqla_jobs_job, sqla_jobs_history, sqla_jobs_queue, sqla_jobs_schedule,"
                " sqla_jobs_worker, sqla_jobs_dependency, sqla_jobs_outcome, sqla_jobs_rate_limiter"
            )
        )
    return engine


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def pytest_sessionstart(session: pytest.Session) -> None:
    """A SIGTERM stops the run as a Ctrl-C does: the session's teardown drops its database and
    stops the embedded server (Python's default for SIGTERM is to die, running no finalizer)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
