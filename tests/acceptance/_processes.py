"""Helpers for tests that run real ``sqla-jobs`` processes against the session's database."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

# The acceptance tests take their deadline from here (re-exported).
from tests._waiting import DEADLINE as DEADLINE
from tests._waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def cli_env(database_url: str | None) -> dict[str, str]:
    """The environment of a ``sqla-jobs`` process: ours, without any SQLA_JOBS_* setting that
    would change its behaviour, and with ``DATABASE_URL``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLA_JOBS_")}
    env.pop("DATABASE_URL", None)
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return env


def run_cli(*args: str, database_url: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sqla_jobs.cli ARGS`` to completion from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", *args],
        cwd=REPO,
        env=cli_env(database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


@dataclass
class WorkerProcess:
    """A ``sqla-jobs worker tests.acceptance.app:jobs`` process and its log file."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_logged(self, event: str) -> None:
        """Wait until the worker logs ``event=<event>`` (or fail, showing the log)."""
        try:
            wait_until(lambda: f"event={event}" in self.log, f"worker logs event={event}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; exit code {self.proc.poll()}; log:\n{self.log}") from None


@contextlib.contextmanager
def dashboard(
    url: str, log: Path, *args: str, env: dict[str, str] | None = None, exit_0: bool = True
) -> Iterator[int]:
    """``sqla-jobs dashboard --port 0 ARGS`` on ``url``'s database, its output in ``log``; the port
    it says it listens on. Stopped with SIGTERM at the end, which must exit 0 (``exit_0``)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqla_jobs.cli", "dashboard", "--port", "0", *args],
            cwd=REPO,
            env={**cli_env(url), **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        started = wait_until(
            lambda: proc.poll() is not None or re.search(r"http://[^/\s]+:(\d+)/", log.read_text()),
            "the dashboard says where it listens",
        )
        assert proc.poll() is None, log.read_text()
        assert isinstance(started, re.Match)
        yield int(started.group(1))
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    if exit_0:
        assert code == 0, log.read_text()
