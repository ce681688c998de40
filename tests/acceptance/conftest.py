"""Fixtures for tests that run real ``sqla-jobs`` processes against the session's database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from tests.acceptance._processes import REPO, WorkerProcess, cli_env
from tests.acceptance.app import EFFECTS_DDL, EFFECTS_TABLE
from tests.conftest import create_database, drop_database


@pytest.fixture
def effects(clean: Engine) -> Engine:
    """The engine, with an empty ``acceptance_effects`` table (and empty queue tables)."""
    with clean.begin() as conn:
        conn.execute(text(EFFECTS_DDL))
        conn.execute(text(f"TRUNCATE {EFFECTS_TABLE}"))
    return clean


@pytest.fixture
def ops_effects(effects: Engine) -> Engine:
    """:func:`effects`, with no queue paused or resumed either (``sqla_jobs_queue`` empty)."""
    with effects.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_queue"))
    return effects


@pytest.fixture
def spawn_worker(migrated_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes on the session database; any still running at the end are killed."""
    started: list[WorkerProcess] = []

    def spawn(*options: str, target: str = "tests.acceptance.app:jobs") -> WorkerProcess:
        log_path = tmp_path / f"worker-{len(started)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sqla_jobs.cli",
                    "worker",
                    target,
                    *options,
                ],
                cwd=REPO,
                env=cli_env(migrated_url),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        worker = WorkerProcess(proc, log_path)
        started.append(worker)
        return worker

    try:
        yield spawn
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.kill()
        for w in started:
            w.proc.wait(10)


@pytest.fixture
def empty_url(server_url: str) -> Iterator[str]:
    """A database of its own, empty (not migrated): a new user's, for the tests that follow a
    page's first steps."""
    url = create_database(server_url, prefix="sqla_jobs_first_run")
    try:
        yield url
    finally:
        drop_database(server_url, url)
