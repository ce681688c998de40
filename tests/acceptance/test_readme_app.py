"""The README's "Your application in five minutes", followed as a new user would, from an empty
directory and an empty database: ``alembic init``, the README's edits to alembic.ini and env.py,
its files, then every command it shows, in order, each as its own process, up to the worker that
runs the job. Its printed output is compared with what the commands print, minus times and names.
Then the README's "Testing your handlers" test, run by pytest in that application with the
package's plugin, on the same database.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqla_jobs.db.urls import sqlalchemy_url
from tests import _readme
from tests.acceptance._first_run import (
    PLACEHOLDER,
    assert_logged_in_order,
    run,
    run_worker,
    shape,
    write_files,
)
from tests.acceptance._processes import cli_env
from tests.conftest import create_database, drop_database

SECTION = _readme.section(_readme.FIVE_MINUTES)


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


@pytest.fixture
def test_database_url(server_url: str) -> Iterator[str]:
    """The application's own empty test database, beside its database (empty_url)."""
    url = create_database(server_url, prefix="sqla_jobs_first_run_test")
    try:
        yield url
    finally:
        drop_database(server_url, url)


def test_the_five_minute_application_runs_a_job_as_the_readme_shows(
    tmp_path: Path, empty_url: str, test_database_url: str
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
    write_files(written, tmp_path)
    assert "Add an empty `myapp/__init__.py`" in SECTION
    (tmp_path / "myapp" / "__init__.py").write_text("")

    # alembic init, then the README's edits, then every other command in order.
    init, *commands = commands
    assert init == ("alembic", "init", "migrations")
    run(list(init), tmp_path, env)
    (ini_lines,) = _readme.blocks(SECTION, "ini")
    apply_ini(tmp_path / "alembic.ini", ini_lines, url)
    env_py = tmp_path / "migrations" / "env.py"
    (target_metadata,) = [b for b in _readme.blocks(SECTION, "python") if "target_metadata" in b]
    assert env_py.read_text().count("target_metadata = None\n") == 1
    env_py.write_text(env_py.read_text().replace("target_metadata = None\n", target_metadata))

    worker_command = ("sqla-jobs", "worker", "myapp.tasks:jobs")
    assert commands[-1] == worker_command, "the section ends with the worker"
    for command in commands[:-1]:
        printed = run(list(command), tmp_path, env)
        if command[0] != "alembic":  # shown in a console block, with what it prints
            shown = _readme.console_output(SECTION, " ".join(command))
            assert [shape(x) for x in printed.splitlines()] == [shape(x) for x in shown], command

    # The worker runs the job, logging what the README shows, and stops on SIGTERM.
    logged = run_worker(worker_command, tmp_path, env)
    assert_logged_in_order(logged, _readme.console_output(SECTION, " ".join(worker_command)))
    # Its row was deleted, as the README says.
    assert "(no jobs)" in run(["sqla-jobs", "jobs", "list"], tmp_path, env)

    # The README's test of the application, as its "Testing your handlers" says: env.py takes
    # DATABASE_URL, pytest finds myapp through pyproject.toml, on an empty test database of its own.
    testing = _readme.section("Testing your handlers")
    ((path, source),) = _readme.files(testing).items()
    write_files({path: source}, tmp_path)
    env_lines = next(b for b in _readme.blocks(testing, "python") if "set_main_option" in b)
    assert "after `config = context.config`" in testing
    assert env_py.read_text().count("config = context.config\n") == 1
    env_py.write_text(
        env_py.read_text().replace(
            "config = context.config\n", f"config = context.config\n{env_lines}"
        )
    )
    (toml,) = _readme.blocks(testing, "toml")
    assert "in `pyproject.toml`" in testing
    (tmp_path / "pyproject.toml").write_text(toml)
    test_env = dict(env)
    export, *steps = _readme.commands(testing)
    assert export[0] == "export"
    name, value = export[1].split("=", 1)
    assert value == PLACEHOLDER + "_test"
    test_env[name] = sqlalchemy_url(test_database_url)
    assert steps == [("alembic", "upgrade", "heads"), ("pytest",)]
    run(list(steps[0]), tmp_path, test_env)
    tested = run(list(steps[1]), tmp_path, test_env)
    assert "1 passed" in tested, tested
    # The test's transaction was rolled back: its order and job are gone.
    assert "(no jobs)" in run(["sqla-jobs", "jobs", "list"], tmp_path, test_env)
