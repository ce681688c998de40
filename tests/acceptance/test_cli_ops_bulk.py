"""``sqla-jobs jobs retry/delete/cancel`` by filter ask before they run: they say how many jobs they
would touch (and the per-run cap), list them with ``--dry-run``, prompt on a terminal, and refuse
without ``--yes`` anywhere else; each refusal changes nothing."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest
from sqlalchemy import Engine

from tests.acceptance._processes import DEADLINE, REPO, cli_env
from tests.acceptance.test_cli import assert_one_line_error
from tests.acceptance.test_cli_ops import cli, enqueue, execute, make_dead, make_running, snapshot

#: A command by filter, and the jobs it would touch of those :func:`jobs_of_each_kind` makes.
BY_FILTER = {
    "retry": ["retry", "--all-dead", "--queue", "ops"],
    "delete": ["delete", "--all-dead", "--queue", "ops"],
    "cancel": ["cancel", "--queue", "ops"],
}


#: How each command by filter says the jobs of :func:`jobs_of_each_kind` it would touch.
COUNTED = {
    "retry": "2 dead jobs",
    "delete": "2 dead jobs",
    "cancel": "1 pending job and 1 running job",
}


def jobs_of_each_kind(engine: Engine) -> dict[str, list[int]]:
    """Two dead jobs and a pending and a running one in queue ``ops``, a dead one elsewhere; by
    command, the ids it would touch."""
    dead = enqueue(engine, "a", "b")
    pending, running = enqueue(engine, "c", "d")
    (elsewhere,) = enqueue(engine, "e", queue="other")
    for job_id in (*dead, elsewhere):
        make_dead(engine, job_id)
    make_running(engine, running)
    return {"retry": dead, "delete": dead, "cancel": [pending, running]}


@pytest.mark.parametrize("command", sorted(BY_FILTER))
def test_by_filter_off_a_terminal_without_yes_exits_2_saying_the_count_and_changes_nothing(
    ops_effects: Engine, migrated_url: str, command: str
) -> None:
    jobs_of_each_kind(ops_effects)
    before = snapshot(ops_effects)
    result = cli(migrated_url, "jobs", *BY_FILTER[command])
    assert result.returncode == 2
    counted = COUNTED[command]
    assert_one_line_error(
        result.stderr, f"it would {command} {counted} (queue ops, any kind)", "--yes", "nothing"
    )
    assert result.stdout == ""
    assert snapshot(ops_effects) == before


@pytest.mark.parametrize("command", sorted(BY_FILTER))
def test_dry_run_by_filter_lists_what_it_would_touch_and_changes_nothing(
    ops_effects: Engine, migrated_url: str, command: str
) -> None:
    touched = jobs_of_each_kind(ops_effects)[command]
    before = snapshot(ops_effects)
    result = cli(migrated_url, "jobs", *BY_FILTER[command], "--dry-run")
    assert result.returncode == 0, result.stderr
    counted = COUNTED[command]
    ids = ", ".join(map(str, touched))
    assert result.stdout == f"would {command} {counted} (queue ops, any kind): ids {ids}\n"
    assert snapshot(ops_effects) == before


def test_dry_run_by_ids_runs_the_checks_says_what_it_would_do_and_changes_nothing(
    ops_effects: Engine, migrated_url: str
) -> None:
    touched = jobs_of_each_kind(ops_effects)
    before = snapshot(ops_effects)
    dead = ", ".join(map(str, touched["retry"]))
    retry = cli(migrated_url, "jobs", "retry", *map(str, touched["retry"]), "--dry-run")
    assert (retry.returncode, retry.stdout) == (0, f"would retry 2 jobs: {dead}\n"), retry.stderr
    delete = cli(migrated_url, "jobs", "delete", *map(str, touched["delete"]), "--dry-run")
    assert (delete.returncode, delete.stdout) == (0, f"would delete 2 jobs: {dead}\n")
    pending, running = touched["cancel"]
    cancel = cli(migrated_url, "jobs", "cancel", str(pending), str(running), "--dry-run")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.splitlines()[0] == f"would cancel 1 pending job: {pending}"
    assert cancel.stdout.splitlines()[1].startswith(
        f"would ask the workers to stop 1 running job: {running}"
    )
    refused = cli(migrated_url, "jobs", "retry", str(running), "--dry-run")
    assert refused.returncode == 6
    assert_one_line_error(refused.stderr, f"job {running} is running", "nothing changed")
    assert snapshot(ops_effects) == before


def test_dry_run_says_the_per_run_cap_plainly_when_more_jobs_match_than_one_run_touches(
    ops_effects: Engine, migrated_url: str
) -> None:
    execute(
        ops_effects,
        "INSERT INTO sqla_jobs_job (queue, kind, payload, state, attempts, finished_at) "
        "SELECT 'ops', 'note', '{}', 'dead', 1, now() FROM generate_series(1, 10003)",
    )
    result = cli(migrated_url, "jobs", "retry", "--all-dead", "--dry-run")
    assert result.returncode == 0, result.stderr
    first, cap = result.stdout.splitlines()
    assert first.startswith("would retry 10,000 dead jobs (any queue, any kind): ids ")
    assert first.endswith(" and 9,980 more")
    assert cap.startswith("10,000 of 10,003 matching jobs: this run touches the first 10,000")


def on_terminal(url: str, args: list[str], answer: str) -> tuple[int, str]:
    """Run ``sqla-jobs ARGS`` on a pseudo-terminal, answer its prompt with ``answer``; its exit
    code and all it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqla_jobs.cli", *args],
        cwd=REPO,
        env=cli_env(url),
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    answered = False
    deadline = time.monotonic() + DEADLINE * 2
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"[y/N] " in seen:
                os.write(master, answer.encode() + b"\n")
                answered = True
            if proc.poll() is not None and not ready:
                break
        code = proc.wait(timeout=DEADLINE)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert answered, seen.decode(errors="replace")
    return code, seen.decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.parametrize("command", sorted(BY_FILTER))
def test_on_a_terminal_by_filter_shows_the_count_and_runs_only_after_a_yes(
    ops_effects: Engine, migrated_url: str, command: str
) -> None:
    touched = jobs_of_each_kind(ops_effects)[command]
    before = snapshot(ops_effects)
    code, out = on_terminal(migrated_url, ["jobs", *BY_FILTER[command]], "n")
    assert code == 1, out
    assert f"ids {', '.join(map(str, touched))}" in out
    assert f"{command} {COUNTED[command]}? [y/N]" in out
    assert f"{command} not confirmed: nothing changed" in out
    assert snapshot(ops_effects) == before

    code, out = on_terminal(migrated_url, ["jobs", *BY_FILTER[command]], "y")
    assert code == 0, out
    states = {row[0]: row[1] for row in snapshot(ops_effects) if row[0] in touched}
    if command == "retry":
        assert set(states.values()) == {"pending"}
    elif command == "delete":
        assert states == {}
    else:
        assert sorted(states.values()) == ["cancelled", "running"]
