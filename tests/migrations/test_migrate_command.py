"""``sqla-jobs migrate``: its own version table, what it takes over, what it refuses, and its
errors. Each test runs the command (``cli.main``) on a database of its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.pool import NullPool

import sqla_jobs
from sqla_jobs import migrate
from sqla_jobs.cli.entry import main
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.sql import catalog as catalog_sql
from tests._waiting import wait_until
from tests.migrations._catalog import (
    OWN_VERSIONS,
    SHARED_VERSIONS,
    catalog,
    connect,
    execute_sql,
    sqla_jobs_objects,
    tables,
    version_rows,
)
from tests.migrations._revision_files import SHIPPED_HEAD

SCHEMA = "jobsschema"
UNREACHABLE_URL = "postgresql://nobody@127.0.0.1:1/nowhere"
#: An application's own revision, as in the report.
APP_REVISION = "29b00b14549c"
#: The revision before the newest: where a database an earlier release migrated may stand.
PREVIOUS = str(
    ScriptDirectory.from_config(migrate.alembic_config(UNREACHABLE_URL))
    .get_revision(SHIPPED_HEAD)
    .down_revision
)

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """``sqla-jobs ARGS`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("SQLA_JOBS_SCHEMA", raising=False)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def as_an_earlier_release_left_it(url: str, schema: str | None = None) -> None:
    """Turn sqla-jobs' own version table into what an earlier ``sqla-jobs migrate`` wrote:
    Alembic's default ``alembic_version``, in the same schema."""
    where = f"{schema}." if schema else ""
    execute_sql(
        url,
        f"ALTER TABLE {where}{OWN_VERSIONS} RENAME TO {SHARED_VERSIONS}",
        f"ALTER TABLE {where}{SHARED_VERSIONS} "
        f"RENAME CONSTRAINT {OWN_VERSIONS}_pkc TO {SHARED_VERSIONS}_pkc",
    )


def assert_one_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sqla-jobs: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


def test_migrate_creates_everything_and_records_it_in_its_own_version_table(
    scratch_url: str, run: Run
) -> None:
    code, out, _ = run("migrate", "--database-url", scratch_url)

    assert code == 0
    assert out == f"created sqla-jobs' tables: {SHIPPED_HEAD} (recorded in {OWN_VERSIONS})\n"
    assert version_rows(scratch_url) == {SHIPPED_HEAD}
    assert "public.alembic_version" not in tables(scratch_url)
    assert "public.sqla_jobs_job" in tables(scratch_url)


def test_migrate_leaves_the_applications_alembic_version_alone(scratch_url: str, run: Run) -> None:
    """The report: a database at the application's own revision, which sqla-jobs does not know
    ("Can't locate revision identified by '29b00b14549c'")."""
    execute_sql(
        scratch_url,
        "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
        f"INSERT INTO alembic_version VALUES ('{APP_REVISION}')",
    )

    code, _, err = run("migrate", "--database-url", scratch_url)

    assert (code, err) == (0, "")
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {APP_REVISION}
    assert version_rows(scratch_url) == {SHIPPED_HEAD}


@pytest.mark.parametrize("schema", [None, SCHEMA])
def test_migrate_takes_over_a_database_an_earlier_release_migrated_running_only_what_is_new(
    scratch_url: str, run: Run, caplog: pytest.LogCaptureFixture, schema: str | None
) -> None:
    where = "public" if schema is None else schema
    execute_sql(scratch_url, f"CREATE SCHEMA IF NOT EXISTS {where}")
    command.upgrade(migrate.alembic_config(scratch_url, schema), PREVIOUS)
    as_an_earlier_release_left_it(scratch_url, schema)
    execute_sql(
        scratch_url, f"INSERT INTO {where}.sqla_jobs_job (kind, payload) VALUES ('k', '{{}}')"
    )
    caplog.set_level("INFO", logger="alembic.runtime.migration")

    code, out, _ = run(
        "migrate", "--database-url", scratch_url, *(["--schema", schema] * bool(schema))
    )

    assert code == 0
    prefix = "" if schema is None else f"{schema}."
    assert out.splitlines()[0] == (
        f"moved {PREVIOUS} from {prefix}alembic_version to {prefix}{OWN_VERSIONS}, where "
        "sqla-jobs migrate records its revisions"
    )
    ran = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Running ")]
    assert ran == [f"Running upgrade {PREVIOUS} -> {SHIPPED_HEAD}, " + ran[0].split(", ", 1)[1]]
    assert version_rows(scratch_url, where) == {SHIPPED_HEAD}
    assert f"{where}.alembic_version" not in tables(scratch_url)
    with connect(scratch_url) as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {where}.sqla_jobs_job")).scalar() == 1


def test_a_second_migrate_finds_nothing_to_do_and_runs_no_ddl(scratch_url: str, run: Run) -> None:
    assert run("migrate", "--database-url", scratch_url)[0] == 0
    with connect(scratch_url) as conn:
        before = catalog(conn, "public")
    executed: list[str] = []

    def record(*args: Any) -> None:
        executed.append(str(args[2]).lstrip().upper())

    event.listen(Engine, "before_cursor_execute", record)
    try:
        code, out, _ = run("migrate", "--database-url", scratch_url)
    finally:
        event.remove(Engine, "before_cursor_execute", record)

    assert code == 0
    assert out == f"sqla-jobs' tables are up to date: {SHIPPED_HEAD} (recorded in {OWN_VERSIONS})\n"
    assert executed, "the listener saw the command's queries"
    assert [s for s in executed if not s.startswith("SELECT")] == []
    with connect(scratch_url) as conn:
        assert catalog(conn, "public") == before


def test_migrate_refuses_sqla_jobs_revisions_the_applications_environment_runs_until_adopted(
    scratch_url: str, run: Run
) -> None:
    """alembic_version holds sqla-jobs' revision beside the application's: the application's
    environment runs it. Refused (nothing changes) until ``--adopt`` hands it over, and then only
    sqla-jobs' row moves."""
    assert run("migrate", "--database-url", scratch_url)[0] == 0
    as_an_earlier_release_left_it(scratch_url)
    execute_sql(scratch_url, f"INSERT INTO alembic_version VALUES ('{APP_REVISION}')")
    objects = sqla_jobs_objects(scratch_url)

    code, out, err = run("migrate", "--database-url", scratch_url)

    assert (code, out) == (2, "")
    assert_one_line(err, SHIPPED_HEAD, APP_REVISION, "`alembic upgrade heads`", "--adopt")
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {SHIPPED_HEAD, APP_REVISION}
    assert "public.sqla_jobs_alembic_version" not in tables(scratch_url)
    assert sqla_jobs_objects(scratch_url) == objects

    code, out, err = run("migrate", "--adopt", "--database-url", scratch_url)

    assert (code, err) == (0, "")
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {APP_REVISION}
    assert version_rows(scratch_url) == {SHIPPED_HEAD}
    assert sqla_jobs_objects(scratch_url) == objects


def test_migrate_refuses_tables_that_no_version_table_accounts_for(
    scratch_url: str, run: Run
) -> None:
    """As Alembic leaves a database whose application revisions depend on sqla-jobs' (only the
    application's head is listed), or as create_all leaves one: running 0001 would run it twice."""
    engine = create_engine(sqlalchemy_url(scratch_url), poolclass=NullPool)
    sqla_jobs.metadata.create_all(engine)
    engine.dispose()

    code, _, err = run("migrate", "--database-url", scratch_url)

    assert code == 2
    assert_one_line(err, "sqla_jobs_job exists but no sqla-jobs revision is recorded")
    assert "public.sqla_jobs_alembic_version" not in tables(scratch_url)


def test_migrate_refuses_revisions_recorded_in_both_version_tables(
    scratch_url: str, run: Run
) -> None:
    assert run("migrate", "--database-url", scratch_url)[0] == 0
    execute_sql(
        scratch_url,
        "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
        f"INSERT INTO alembic_version VALUES ('{PREVIOUS}')",
    )

    code, _, err = run("migrate", "--database-url", scratch_url)

    assert code == 2
    assert_one_line(err, "recorded twice", f"drop {OWN_VERSIONS}")
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {PREVIOUS}
    assert version_rows(scratch_url) == {SHIPPED_HEAD}


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        ((), 2, "no database: set DATABASE_URL or pass --database-url"),
        (("--database-url", "not a url"), 2, "cannot parse database URL"),
        (("--database-url", "mysql://u@h/db"), 2, "unsupported database URL scheme 'mysql'"),
        (("--database-url", UNREACHABLE_URL), 3, "cannot reach the database"),
        (("--sql", "--database-url", "not a url"), 2, "cannot parse database URL"),
        (("--sql", "--adopt", "--database-url", UNREACHABLE_URL), 2, "cannot go with --sql"),
    ],
    ids=["none", "unparseable", "not-postgres", "unreachable", "sql-unparseable", "sql-adopt"],
)
def test_a_bad_url_or_option_is_one_line_on_stderr_without_a_traceback(
    run: Run, args: tuple[str, ...], code: int, fragment: str
) -> None:
    result = run("migrate", *args)

    assert result[:2] == (code, "")
    assert_one_line(result[2], fragment)


def test_migrate_sql_prints_its_own_version_table_without_connecting(run: Run) -> None:
    code, out, err = run("migrate", "--sql", "--database-url", UNREACHABLE_URL)

    assert (code, err) == (0, "")
    assert "CREATE TABLE sqla_jobs_alembic_version (" in out
    assert f"UPDATE sqla_jobs_alembic_version SET version_num='{SHIPPED_HEAD}'" in out
    assert "alembic_version (" not in out.replace("sqla_jobs_alembic_version (", "")


def test_downgrade_removes_every_object_sqla_jobs_created_its_version_table_included(
    scratch_url: str,
) -> None:
    migrate.upgrade(scratch_url)

    migrate.downgrade(scratch_url)

    assert sqla_jobs_objects(scratch_url) == set()
    assert tables(scratch_url) == set()


def test_a_migrate_waits_for_one_already_running_on_the_schema_then_finds_its_work_done(
    scratch_url: str,
) -> None:
    """A deploy's replicas: while one holds the migration lock, another waits for it (in a
    process of its own, as a replica runs), then goes on; it never runs a revision twice."""
    engine = create_engine(sqlalchemy_url(scratch_url), poolclass=NullPool)
    try:
        with engine.connect() as holder:
            holder.execute(catalog_sql.lock_migrations(), {"schema_name": None})
            waiting = subprocess.Popen(
                [sys.executable, "-m", "sqla_jobs.cli", "migrate", "--database-url", scratch_url],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                wait_until(
                    lambda: blocked_on_an_advisory_lock(scratch_url),
                    "the second migrate waits for the migration lock",
                )
                # What the first replica did meanwhile, in its transaction.
                command.upgrade(migrate.alembic_config(scratch_url), "heads")
                holder.commit()
                out, err = waiting.communicate(timeout=120)
            finally:
                waiting.kill()
    finally:
        engine.dispose()

    assert (waiting.returncode, err) == (0, "")
    assert out.startswith("sqla-jobs' tables are up to date")
    assert version_rows(scratch_url) == {SHIPPED_HEAD}


def blocked_on_an_advisory_lock(url: str) -> bool:
    # A connection of its own: pg_stat_activity is read once per transaction.
    with connect(url) as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
            )
        ).scalar()
    return bool(waiting)


def test_every_shipped_revision_carries_the_prefix_migrate_recognises_it_by() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config(UNREACHABLE_URL))
    revisions = [r.revision for r in script.walk_revisions()]

    assert SHIPPED_HEAD in revisions
    assert all(r.startswith(migrate.REVISION_PREFIX) for r in revisions)
