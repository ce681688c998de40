"""Durable steps survive a SIGKILL: the rescued run skips the steps already recorded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import DEADLINE
from tests.acceptance.steps_app import ThreeSteps, jobs

REPO = Path(__file__).resolve().parents[2]


def _worker(url: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sqla_jobs.cli",
            "worker",
            "tests.acceptance.steps_app:jobs",
            "--poll-interval",
            "0.2",
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_sigkill_after_step_two_reruns_only_step_three(clean: Engine, migrated_url: str) -> None:
    with clean.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS step_effects"))
        conn.execute(text("CREATE TABLE step_effects (step text, attempt int)"))
    with Session(clean) as s, s.begin():
        jobs.enqueue(s, ThreeSteps(label="x"))
    first = _worker(migrated_url, "--lease", "2", "--heartbeat", "0.5")
    second = None
    try:
        assert first.wait(DEADLINE) == -9, (
            "the first worker should have been SIGKILLed by its handler"
        )
        second = _worker(migrated_url, "--lease", "2", "--heartbeat", "0.5")
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            with clean.connect() as conn:
                if conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 0:
                    break
            time.sleep(0.1)
        with clean.connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar()
            effects = [
                tuple(r)
                for r in conn.execute(text("SELECT step, attempt FROM step_effects ORDER BY step"))
            ]
        assert left == 0, "the rescued job did not complete"
        assert effects == [("finished crashes=1", 2), ("one", 1), ("three", 2), ("two", 1)]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
