"""The README's "Your application in five minutes", followed as a new user would, from an empty
directory and an empty database: ``alembic init``, the README's edits to alembic.ini and env.py,
its files, then every command it shows, in order, each as its own process, up to the worker that
runs the job. Its printed output is compared with what the commands print, minus times and names.
Then the README's "Testing your handlers" test, run by pytest in that application with the
package's plugin, on the same database.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqla_jobs._db import sqlalchemy_url
from tests import _readme
from tests._waiting import wait_until
from tests.acceptance._processes import cli_env
from tests.conftest import create_database, drop_database

SECTION = _readme.section(_readme.FIVE_MINUTES)
#: The README's placeholder for the reader's database, replaced by the test's.
PLACEHOLDER = "postgresql+psycopg://app:secret@localhost:5432/myapp"
#: How a command the README shows runs here: the same program, from this interpreter.
PROGRAMS = {
    "alembic": [sys.executable, "-m", "alembic"],
    "sqla-jobs": [sys.executable, "-m", "sqla_jobs.cli"],
    "python": [sys.executable],
}


@pytest.fixture
def empty_url(server_url: str) -> Iterator[str]:
    url = create_database(server_url, prefix="sqla_jobs_readme")
    try:
        yield url
    finally:
        drop_database(server_url, url)


def shape(line: str) -> str:
    """A line of output without what differs from run to run: times, durations, worker names."""
    line = re.sub(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?Z?", "TIME", line)
    line = re.sub(r"duration_ms=[\d.]+", "duration_ms=D", line)
    line = re.sub(r"completed in [\d.]+ ms", "completed in D ms", line)
    line = re.sub(r"worker \S+ started", "worker NAME started", line)
    return line.rstrip()


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def apply_ini(ini: Path, lines: str, url: str) -> None:
    """The README's alembic.ini lines, as a reader makes them: each setting already in the
    ``[alembic]`` section is changed, one that is not is added after ``script_location``."""
    source = ini.read_text()
    for line in lines.strip().splitlines():
        key = line.split("=", 1)[0].strip()
        line = line.replace(PLACEHOLDER, url.replace("%", "%%"))
        existing = re.search(rf"^{re.escape(key)} = .*$", source, flags=re.MULTILINE)
        if existing:
            source = source[: existing.start()] + line + source[existing.end() :]
        else:
            anchor = re.search(r"^script_location = .*$", source, flags=re.MULTILINE)
            assert anchor, "alembic init wrote no script_location"
            source = source[: anchor.end()] + "\n" + line + source[anchor.end() :]
    ini.write_text(source)


def test_the_five_minute_application_runs_a_job_as_the_readme_shows(
    tmp_path: Path, empty_url: str
) -> None:
    url = sqlalchemy_url(empty_url)
    assert url.startswith("postgresql+psycopg://")
    commands = _readme.commands(SECTION)
    env = cli_env(None)

    # export DATABASE_URL=...: the first command, before any other.
    export, *commands = commands
    assert export[0] == "export"
    name, value = export[1].split("=", 1)
    assert value == PLACEHOLDER
    env[name] = url

    # The files of the application, then the one the README says to add.
    written = _readme.files(SECTION)
    assert set(written) >= {"myapp/models.py", "myapp/tasks.py", "myapp/checkout.py"}
    for path, source in written.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    assert "Add an empty `myapp/__init__.py`" in SECTION
    (tmp_path / "myapp" / "__init__.py").write_text("")

    # alembic init, then the README's edits, then every other command in order.
    init, *commands = commands
    assert init == ("alembic", "init", "migrations")
    run([*PROGRAMS["alembic"], *init[1:]], tmp_path, env)
    (ini_lines,) = _readme.blocks(SECTION, "ini")
    apply_ini(tmp_path / "alembic.ini", ini_lines, url)
    env_py = tmp_path / "migrations" / "env.py"
    (target_metadata,) = [b for b in _readme.blocks(SECTION, "python") if "target_metadata" in b]
    assert env_py.read_text().count("target_metadata = None\n") == 1
    env_py.write_text(env_py.read_text().replace("target_metadata = None\n", target_metadata))

    worker_command = ("sqla-jobs", "worker", "myapp.tasks:jobs")
    assert commands[-1] == worker_command, "the section ends with the worker"
    for command in commands[:-1]:
        printed = run([*PROGRAMS[command[0]], *command[1:]], tmp_path, env)
        if command[0] != "alembic":  # shown in a console block, with what it prints
            shown = _readme.console_output(SECTION, " ".join(command))
            assert [shape(x) for x in printed.splitlines()] == [shape(x) for x in shown], command

    # The worker runs the job, logging what the README shows, and stops on SIGTERM.
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [*PROGRAMS["sqla-jobs"], *worker_command[1:]],
            cwd=tmp_path,
            env=env,
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
    logged = iter(shape(x) for x in log_path.read_text().splitlines())
    for line in _readme.console_output(SECTION, " ".join(worker_command)):
        assert shape(line) in logged, f"the worker did not log, in this order: {line}"
    # Its row was deleted, as the README says.
    assert "(no jobs)" in run([*PROGRAMS["sqla-jobs"], "jobs", "list"], tmp_path, env)

    # The README's test of the application, with the plugin, on the database just migrated.
    ((path, source),) = _readme.files(_readme.section("Testing your handlers")).items()
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(source)
    tested = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", path],
        tmp_path,
        {**env, "PYTHONPATH": str(tmp_path)},
    )
    assert "1 passed" in tested, tested
    # The test's transaction was rolled back: its order and job are gone.
    assert "(no jobs)" in run([*PROGRAMS["sqla-jobs"], "jobs", "list"], tmp_path, env)
