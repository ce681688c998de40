"""What the tests that follow a page as a new user would share (the README's five minutes,
docs/getting-started.md): running its commands as their own processes, the worker until it has
run the job, and output compared without what differs from run to run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from tests._waiting import wait_until

#: The pages' placeholder for the reader's database, replaced by the test's.
PLACEHOLDER = "postgresql+psycopg://app:secret@localhost:5432/myapp"
#: How a command a page shows runs here: the same program, from this interpreter.
PROGRAMS = {
    "alembic": [sys.executable, "-m", "alembic"],
    "sqla-jobs": [sys.executable, "-m", "sqla_jobs.cli"],
    "python": [sys.executable],
    # The console script, not ``python -m pytest``: it does not put the directory on sys.path.
    "pytest": [str(Path(sys.executable).with_name("pytest"))],
}


def shape(line: str) -> str:
    """A line of output without what differs from run to run: times, durations, worker names."""
    line = re.sub(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?Z?", "TIME", line)
    line = re.sub(r"duration_ms=[\d.]+", "duration_ms=D", line)
    line = re.sub(r"completed in [\d.]+ ms", "completed in D ms", line)
    line = re.sub(r"worker \S+ started", "worker NAME started", line)
    return line.rstrip()


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run a command the page shows (its program from :data:`PROGRAMS`) to success; its stdout."""
    done = subprocess.run(
        [*PROGRAMS.get(argv[0], [argv[0]]), *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def write_files(files: dict[str, str], root: Path) -> None:
    for path, source in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(source)


def run_worker(argv: tuple[str, ...], cwd: Path, env: dict[str, str]) -> list[str]:
    """Run the page's worker command until it logs a completed job, stop it with SIGTERM (it must
    exit 0), and return what it printed, shaped. Unbuffered, as on the reader's terminal: what a
    handler prints comes between the worker's log lines, not at exit."""
    log_path = cwd / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [*PROGRAMS[argv[0]], *argv[1:]],
            cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "event=completed" in log_path.read_text(), "the worker runs the job")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log_path.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    return [shape(x) for x in log_path.read_text().splitlines()]


def assert_logged_in_order(logged: list[str], shown: list[str]) -> None:
    """Every line the page shows the worker print is among what it printed, in that order."""
    rest = iter(logged)
    for line in shown:
        assert shape(line) in rest, f"the worker did not print, in this order: {line}\n{logged}"
