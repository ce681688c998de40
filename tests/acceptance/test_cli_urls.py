"""The application's own ``DATABASE_URL``, as ``postgresql+asyncpg://`` or ``postgresql+psycopg2://``
with those drivers' query parameters, given to real ``sqla-jobs`` processes: the worker and every
command connect with psycopg 3 (neither driver is imported), and a parameter with no libpq
equivalent is a one-line error naming it, never a traceback or the password."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from tests._waiting import wait_until
from tests.acceptance._processes import DEADLINE, REPO, WorkerProcess, cli_env, run_cli
from tests.acceptance.app import EFFECTS_TABLE, Work, jobs
from tests.acceptance.test_cli import assert_one_line_error
from tests.acceptance.test_cli_ops import snapshot
from tests.integration.test_multi_host import multi_host_url

#: ``hunter2@:/?#%' x``, URL-encoded: the characters a URL and a libpq connection string give
#: meanings to. The test server trusts 127.0.0.1, so it is never checked: what is proved is that it
#: is carried through both forms without breaking them, and never printed.
ENCODED_PASSWORD = "hunter2%40%3A%2F%3F%23%25%27%20x"

#: Each driver's own way of saying what an application's URL says.
DRIVER_QUERIES = {
    "asyncpg": "ssl=prefer&prepared_statement_cache_size=0&command_timeout=60&timeout=10",
    "psycopg2": "sslmode=prefer&connect_timeout=10&application_name=shop",
}


def app_url(migrated_url: str, driver: str) -> str:
    """The session database's URL as an application on ``driver`` writes it."""
    url = make_url(migrated_url)
    # A TCP server is host:port; the embedded one is a socket directory in ?host=, kept as it is.
    where = f"{url.host}:{url.port}" if url.host else ""
    socket = "".join(f"&{k}={v}" for k, v in url.query.items())
    return (
        f"postgresql+{driver}://{url.username}:{ENCODED_PASSWORD}@{where}/"
        f"{url.database}?{DRIVER_QUERIES[driver]}{socket}"
    )


def assert_no_password(text_: str) -> None:
    assert "hunter2" not in text_
    assert "Traceback" not in text_


@pytest.fixture
def driverless_env(tmp_path: Path) -> Callable[[str], dict[str, str]]:
    """The environment of a ``sqla-jobs`` process on ``DATABASE_URL``, in which importing asyncpg
    or psycopg2 fails: the process proves it never imports the driver its URL names."""
    stubs = tmp_path / "no-drivers"
    for name in ("asyncpg", "psycopg2"):
        (stubs / name).mkdir(parents=True)
        (stubs / name / "__init__.py").write_text(
            f"raise ImportError('sqla-jobs must not import {name}')\n"
        )

    def env(url: str) -> dict[str, str]:
        return {**cli_env(url), "PYTHONPATH": str(stubs)}

    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m sqla_jobs.cli ARGS`` to completion, in ``env``, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("driver", sorted(DRIVER_QUERIES))
def test_a_worker_given_the_applications_asyncpg_or_psycopg2_url_runs_jobs_and_stops_cleanly(
    effects: Engine,
    migrated_url: str,
    tmp_path: Path,
    driverless_env: Callable[[str], dict[str, str]],
    driver: str,
) -> None:
    url = app_url(migrated_url, driver)
    with Session(effects) as session:
        job_id = jobs.enqueue(session, Work(tag=driver)).id
        session.commit()
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        # The handler records its effects through the same URL (DATABASE_URL), as an app would.
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqla_jobs.cli", "worker", "tests.acceptance.app:jobs"],
            cwd=REPO,
            env=driverless_env(url),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    worker = WorkerProcess(proc, log_path)
    try:
        wait_until(
            lambda: _events(effects, job_id) == ["started", "finished"] or proc.poll() is not None,
            "the worker runs the job (or exits)",
        )
        assert proc.poll() is None, worker.log
        assert _events(effects, job_id) == ["started", "finished"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0, worker.log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(DEADLINE)
    assert_no_password(worker.log)


def _events(engine: Engine, job_id: int) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.scalars(
                text(f"SELECT event FROM {EFFECTS_TABLE} WHERE job_id = :id ORDER BY seq"),
                {"id": job_id},
            )
        )


COMMANDS = [
    ("stats",),
    ("jobs", "list"),
    ("queues",),
    ("queues", "pause", "url-test", "--new"),
    ("queues", "resume", "url-test"),
    ("schedules", "list", "tests.acceptance.schedules_app:jobs"),
    ("prune", "--older-than", "7d", "--dry-run"),
    ("migrate",),
]


@pytest.mark.parametrize("driver", sorted(DRIVER_QUERIES))
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_takes_the_applications_asyncpg_or_psycopg2_url(
    ops_effects: Engine,
    migrated_url: str,
    driverless_env: Callable[[str], dict[str, str]],
    driver: str,
    command: tuple[str, ...],
) -> None:
    result = run(driverless_env(app_url(migrated_url, driver)), *command)
    assert result.returncode == 0, result.stderr
    assert_no_password(result.stdout + result.stderr)


@pytest.mark.parametrize(
    "args",
    [("worker", "tests.acceptance.app:jobs"), ("stats",), ("jobs", "list")],
    ids=" ".join,
)
def test_a_url_parameter_with_no_libpq_equivalent_exits_2_naming_it(
    ops_effects: Engine, migrated_url: str, args: tuple[str, ...]
) -> None:
    url = app_url(migrated_url, "asyncpg") + "&server_settings=hunter2"
    before = snapshot(ops_effects)
    result = run_cli(*args, "--database-url", url, database_url=None)
    assert result.returncode == 2, result.stderr
    assert_one_line_error(
        result.stderr, "'server_settings' of the asyncpg driver", "no libpq equivalent"
    )
    assert_no_password(result.stderr)
    assert snapshot(ops_effects) == before


def test_asyncpgs_ssl_reaches_libpq_as_sslmode(ops_effects: Engine, migrated_url: str) -> None:
    """``ssl=require`` is obeyed, not dropped: against a server without SSL the command cannot
    connect (exit 3), against one with SSL it can."""
    if make_url(migrated_url).host is None:
        pytest.skip("the server is on a Unix socket, where libpq ignores sslmode")
    with ops_effects.connect() as conn:
        server_ssl = conn.scalar(text("SHOW ssl")) == "on"
    url = app_url(migrated_url, "asyncpg").replace("ssl=prefer", "ssl=require")
    result = run_cli("stats", "--database-url", url, database_url=None)
    assert_no_password(result.stderr)
    if server_ssl:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 3, result.stderr
        assert_one_line_error(result.stderr, "cannot reach the database", "SSL")


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_takes_a_multi_host_url_whose_first_host_refuses(
    ops_effects: Engine, migrated_url: str, command: tuple[str, ...]
) -> None:
    """SQLAlchemy's ``?host=h1:5432&host=h2:5432&target_session_attrs=read-write``, the first
    host closed: libpq goes on to the second, with no warning."""
    result = run_cli(*command, database_url=multi_host_url(migrated_url))
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr


def test_a_command_warns_about_several_hosts_without_target_session_attrs(
    ops_effects: Engine, migrated_url: str
) -> None:
    result = run_cli("stats", database_url=multi_host_url(migrated_url, attrs=None))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("sqla-jobs: warning: the database URL names 2 hosts") == 1
    assert "target_session_attrs=read-write" in result.stderr
