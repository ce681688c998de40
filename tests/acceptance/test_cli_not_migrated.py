"""``sqla-jobs stats`` and ``worker`` on a database whose queue table is missing, in another schema
or out of date: a short message naming the fix and exit code 4, never a traceback."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from sqla_jobs.db.urls import parse_url, sqlalchemy_url
from sqla_jobs.migrate import upgrade
from tests.acceptance._processes import REPO, cli_env, run_cli
from tests.conftest import create_database, drop_database

EXIT_NOT_MIGRATED = 4
WORKER = ("worker", "tests.acceptance.app:jobs")
STATS = ("stats",)


def execute(url: str, *statements: str) -> None:
    engine = create_engine(sqlalchemy_url(url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def unmigrated_url(server_url: str) -> Iterator[str]:
    """A fresh database no migration has run in."""
    url = create_database(server_url, "sqla_jobs_test_bare")
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="module")
def other_schema_url(server_url: str) -> Iterator[str]:
    """A database migrated into schema ``other``, which is not on the search_path."""
    url = create_database(server_url, "sqla_jobs_test_other")
    execute(url, "CREATE SCHEMA other")
    upgrade(url, schema="other")
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="module")
def old_table_url(server_url: str) -> Iterator[str]:
    """A database whose queue table lacks a column the package reads (an older revision)."""
    url = create_database(server_url, "sqla_jobs_test_old")
    upgrade(url)
    execute(url, "ALTER TABLE sqla_jobs_job DROP COLUMN steps")
    yield url
    drop_database(server_url, url)


def assert_short_fix(stderr: str, *fragments: str) -> None:
    """No traceback, at most three lines, the first one an error, and each fragment of the fix."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert 1 <= len(lines) <= 3, f"expected at most three lines, got:\n{stderr}"
    assert lines[0].startswith("sqla-jobs: error: "), stderr
    for fragment in fragments:
        assert fragment in stderr, f"{fragment!r} not in:\n{stderr}"


@pytest.mark.parametrize("args", [WORKER, STATS], ids=["worker", "stats"])
def test_an_unmigrated_database_exits_4_and_says_to_run_the_migrations(
    unmigrated_url: str, args: tuple[str, ...]
) -> None:
    result = run_cli(*args, database_url=unmigrated_url)
    assert result.returncode == EXIT_NOT_MIGRATED, result.stderr
    assert_short_fix(result.stderr, "sqla_jobs_job", "alembic upgrade heads", "sqla-jobs migrate")


def test_the_worker_starts_nothing_on_an_unmigrated_database(unmigrated_url: str) -> None:
    result = run_cli(*WORKER, database_url=unmigrated_url)
    assert result.returncode == EXIT_NOT_MIGRATED, result.stderr
    assert "event=" not in result.stderr, "the worker logged, so it started"


def test_stats_without_schema_names_the_schema_that_holds_the_table(
    other_schema_url: str,
) -> None:
    result = run_cli(*STATS, database_url=other_schema_url)
    assert result.returncode == EXIT_NOT_MIGRATED, result.stderr
    assert_short_fix(result.stderr, '"other"', "--schema other")


def test_stats_with_the_schema_that_holds_the_table_prints_the_queue(
    other_schema_url: str,
) -> None:
    result = run_cli(*STATS, "--schema", "other", database_url=other_schema_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split()[0] == "queue"


def test_stats_with_a_schema_lacking_the_table_names_the_schema_that_holds_it(
    other_schema_url: str,
) -> None:
    result = run_cli(*STATS, "--schema", "public", database_url=other_schema_url)
    assert result.returncode == EXIT_NOT_MIGRATED, result.stderr
    assert_short_fix(result.stderr, '"public"', "--schema other")


def test_the_worker_names_the_schema_its_jobs_should_use(other_schema_url: str) -> None:
    result = run_cli(*WORKER, database_url=other_schema_url)
    assert result.returncode == EXIT_NOT_MIGRATED, result.stderr
    assert_short_fix(result.stderr, '"other"', "Jobs(schema='other')")
    assert "event=" not in result.stderr, "the worker logged, so it started"


@pytest.mark.parametrize("args", [WORKER, STATS], ids=["worker", "stats"])
def test_a_table_missing_a_column_exits_4_and_says_to_upgrade(
    old_table_url: str, args: tuple[str, ...]
) -> None:
    result = run_cli(*args, database_url=old_table_url)
    assert result.returncode == EXIT_NOT_MIGRATED, result.stderr
    assert_short_fix(result.stderr, "steps", "alembic upgrade heads", "sqla-jobs migrate")


@pytest.fixture
def no_privilege_url(migrated_url: str) -> Iterator[str]:
    """``migrated_url`` as a new role that may connect but not read the queue table."""
    role = f"sqla_jobs_test_nopriv_{secrets.token_hex(4)}"
    execute(migrated_url, f'CREATE ROLE "{role}" LOGIN')
    try:
        yield parse_url(migrated_url).set(username=role).render_as_string(hide_password=False)
    finally:
        execute(migrated_url, f'DROP ROLE "{role}"')


def test_another_database_error_is_one_line_and_exit_1(no_privilege_url: str) -> None:
    result = run_cli(*STATS, database_url=no_privilege_url)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sqla-jobs: error: "), result.stderr
    assert "permission denied" in lines[0]
    assert "SQLA_JOBS_DEBUG=1" in lines[0]


def test_sqla_jobs_debug_shows_the_traceback_of_a_database_error(no_privilege_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", "stats"],
        cwd=REPO,
        env={**cli_env(no_privilege_url), "SQLA_JOBS_DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "permission denied" in result.stderr


def test_help_documents_the_exit_codes() -> None:
    result = run_cli("--help", database_url=None)
    assert result.returncode == 0
    assert "4 the database is not migrated" in " ".join(result.stdout.split())
