"""``sqla-jobs prune`` as an operator runs it: what it prints, what it deletes, its exit codes."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from tests.acceptance._processes import run_cli
from tests.acceptance.test_cli import UNREACHABLE, assert_one_line_error


def _fill(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (kind, payload, state, finished_at) "
                "SELECT 'k', '{}', s, now() - CAST(a AS interval) FROM (VALUES "
                "('dead', '10 days'), ('dead', '10 days'), ('dead', '1 day'), "
                "('cancelled', '10 days'), ('completed', '10 days')) AS v (s, a)"
            )
        )
        conn.execute(text("INSERT INTO sqla_jobs_job (kind, payload) VALUES ('k', '{}')"))
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_history (id, queue, kind, payload, attempts, crashes, "
                "created_at, finished_at) SELECT g, 'default', 'k', '{}', 1, 0, now(), "
                "now() - interval '10 days' FROM generate_series(1, 4) g"
            )
        )


def _states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT state, count(*) FROM sqla_jobs_job GROUP BY 1 "
                "UNION ALL SELECT 'history', count(*) FROM sqla_jobs_history"
            )
        ).all()
    return {state: n for state, n in rows if n}


def test_prune_deletes_what_finished_before_the_age_and_prints_it(
    clean: Engine, migrated_url: str
) -> None:
    _fill(clean)
    result = run_cli("prune", "--older-than", "7d", database_url=migrated_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "pruned 1 completed job and 4 history rows finished more than 7d ago",
        "pruned 2 dead jobs finished more than 7d ago",
        "pruned 1 cancelled job finished more than 7d ago",
    ]
    assert _states(clean) == {"dead": 1, "pending": 1}


def test_prune_dry_run_counts_and_deletes_nothing_and_state_narrows_it(
    clean: Engine, migrated_url: str
) -> None:
    _fill(clean)
    result = run_cli(
        "prune", "--older-than", "36h", "--state", "dead", "--dry-run", database_url=migrated_url
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["would prune 2 dead jobs finished more than 36h ago"]
    assert _states(clean) == {"dead": 3, "cancelled": 1, "completed": 1, "pending": 1, "history": 4}
    result = run_cli("prune", "--older-than", "1h", "--state", "dead", database_url=migrated_url)
    assert result.stdout.splitlines() == ["pruned 3 dead jobs finished more than 1h ago"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "prune needs --older-than DURATION"),
        (["--older-than", "7 days"], "--older-than: bad duration '7 days'"),
        (["--older-than", "7d", "--state", "pending"], "--state 'pending' is not a finished state"),
    ],
    ids=["missing-age", "bad-age", "bad-state"],
)
def test_prune_with_bad_input_exits_2_with_a_one_line_error(
    clean: Engine, migrated_url: str, args: list[str], fragment: str
) -> None:
    _fill(clean)
    result = run_cli("prune", *args, database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, fragment)
    assert _states(clean)["dead"] == 3


def test_prune_of_an_unreachable_database_exits_3() -> None:
    result = run_cli(
        "prune", "--older-than", "7d", "--database-url", UNREACHABLE, database_url=None
    )
    assert result.returncode == 3
    assert_one_line_error(result.stderr, "cannot reach the database")


@pytest.mark.parametrize("flag", ["--keep-dead", "--keep-throughput"])
def test_a_bad_keep_flag_stops_the_worker_before_it_starts(migrated_url: str, flag: str) -> None:
    result = run_cli("worker", "tests.acceptance.app:jobs", flag, "week", database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, f"{flag}: bad duration 'week'")
