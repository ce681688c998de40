"""The ``sqla-jobs`` command as a user runs it: exit codes, one-line errors, the stats screen."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import Engine, text

from tests.acceptance._processes import REPO, cli_env, run_cli

#: Port 1 on localhost: nothing listens, so connecting fails at once.
UNREACHABLE = "postgresql://postgres:hunter2@127.0.0.1:1/x"


def assert_one_line_error(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line error, got:\n{stderr}"
    assert lines[0].startswith("sqla-jobs: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("tests.acceptance.app:nope", "module 'tests.acceptance.app' has no attribute 'nope'"),
        ("tests.acceptance.no_such_module:jobs", "cannot import module"),
        (
            "tests.acceptance.raising_app:jobs",
            "importing module 'tests.acceptance.raising_app' raised RuntimeError: "
            "settings are missing SECRET_KEY",
        ),
        ("tests.acceptance.app", "expected MODULE:ATTR"),
        ("tests.acceptance.app:Work", "not a sqla_jobs.Jobs"),
    ],
    ids=["no-attribute", "no-module", "import-raises", "no-colon", "not-jobs"],
)
def test_worker_with_a_bad_target_exits_2_with_a_one_line_error(
    migrated_url: str, target: str, fragment: str
) -> None:
    result = run_cli("worker", target, database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, fragment)


def test_a_target_whose_import_raises_shows_its_traceback_under_sqla_jobs_debug(
    migrated_url: str,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", "worker", "tests.acceptance.raising_app:jobs"],
        cwd=REPO,
        env={**cli_env(migrated_url), "SQLA_JOBS_DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "RuntimeError: settings are missing SECRET_KEY" in result.stderr


@pytest.mark.parametrize("command", ["worker", "stats"])
def test_an_unreachable_database_exits_3_with_a_one_line_error_and_no_password(
    command: str,
) -> None:
    args = [command, "tests.acceptance.app:jobs"] if command == "worker" else [command]
    result = run_cli(*args, "--database-url", UNREACHABLE, database_url=None)
    assert result.returncode == 3, result.stderr
    assert_one_line_error(result.stderr, "cannot reach the database at postgresql://")
    assert "hunter2" not in result.stderr


def test_stats_prints_jobs_per_queue_the_oldest_due_job_and_dead_tuples(
    clean: Engine, migrated_url: str
) -> None:
    with clean.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload, state, run_at) VALUES "
                "('alpha', 'k', '{}', 'pending', now() - interval '90 seconds'), "
                "('alpha', 'k', '{}', 'pending', now() - interval '10 seconds'), "
                "('alpha', 'k', '{}', 'pending', now()), "
                "('alpha', 'k', '{}', 'dead', now()), "
                "('beta', 'k', '{}', 'pending', now() + interval '1 hour'), "
                "('beta', 'k', '{}', 'pending', now() + interval '1 hour')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job "
                "(queue, kind, payload, state, lease_token, lease_expires_at, locked_by) "
                "VALUES ('beta', 'k', '{}', 'running', gen_random_uuid(), now(), 'w')"
            )
        )
    result = run_cli("stats", database_url=migrated_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["queue", "pending", "running", "dead", "oldest", "due"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:3]}
    assert rows["alpha"][:3] == ["3", "0", "1"]
    oldest = rows["alpha"][3]
    assert oldest.endswith("s")
    assert 90 <= float(oldest[:-1]) < 120, "the oldest due job is 90 s late"
    assert rows["beta"] == ["2", "1", "0", "-"], "jobs not yet due are not late"
    (table,) = [line for line in lines if line.startswith("table sqla_jobs_job:")]
    assert " live, " in table
    assert " dead tuples" in table
