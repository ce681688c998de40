"""docs/getting-started.md's "A five-minute application", followed as a new user would, from an
empty directory and an empty database: its files, then every command it shows, in order, each as
its own process (``sqla-jobs migrate`` creating the tables), up to the worker that runs the job.
What the page shows each command print is compared with what it prints, minus times and names.
"""

from __future__ import annotations

from pathlib import Path

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
from tests.acceptance._processes import REPO, cli_env

PAGE = REPO / "docs" / "getting-started.md"
SECTION = _readme.section("A five-minute application", PAGE)


def test_the_getting_started_application_runs_its_job_as_the_page_shows(
    tmp_path: Path, empty_url: str
) -> None:
    url = sqlalchemy_url(empty_url)
    export, *commands = _readme.commands(SECTION)
    assert export[0] == "export", "the page first points DATABASE_URL at the database"
    name, value = export[1].split("=", 1)
    assert (name, value) == ("DATABASE_URL", PLACEHOLDER)
    env = {**cli_env(None), name: url, "PYTHONPATH": str(tmp_path)}

    written = _readme.files(SECTION)
    assert set(written) == {"myapp/tasks.py", "myapp/signup.py"}
    write_files({**written, "myapp/__init__.py": ""}, tmp_path)

    worker_command = ("sqla-jobs", "worker", "myapp.tasks:jobs")
    assert commands[0] == ("sqla-jobs", "migrate")
    assert commands[-1] == worker_command, "the section ends with the worker"
    for command in commands[:-1]:
        printed = run(list(command), tmp_path, env)
        if command[0] == "sqla-jobs" and command[1] == "migrate":
            continue  # shown in an sh block, without its output
        shown = _readme.console_output(SECTION, " ".join(command))
        assert [shape(x) for x in printed.splitlines()] == [shape(x) for x in shown], command

    # The job the page enqueued (and not the rolled-back one) runs, as the page shows.
    logged = run_worker(worker_command, tmp_path, env)
    assert_logged_in_order(logged, _readme.console_output(SECTION, " ".join(worker_command)))
    assert not any("user 43" in line for line in logged), "the rolled-back job ran"
    assert "(no jobs)" in run(["sqla-jobs", "jobs", "list"], tmp_path, env), "its row was deleted"
