"""``sqla-jobs worker --sessionmaker MODULE:ATTR``: handlers that take a Session get one from the
application's maker; a wrong target is a one-line error."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import wait_until
from tests.acceptance._processes import DEADLINE, WorkerProcess, run_cli
from tests.acceptance.session_app import Note, jobs
from tests.acceptance.test_cli import assert_one_line_error

APP = "tests.acceptance.session_app:jobs"


@pytest.fixture
def notes(clean: Engine) -> Iterator[Engine]:
    with clean.begin() as conn:
        conn.execute(text("CREATE TABLE app_note (job_id bigint, text text, origin text)"))
    yield clean
    with clean.begin() as conn:
        conn.execute(text("DROP TABLE app_note"))


def written(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT text, origin FROM app_note ORDER BY text"))
        return [(r.text, r.origin) for r in rows]


@pytest.mark.parametrize(
    ("options", "origin"),
    [(("--sessionmaker", "tests.acceptance.session_app:maker"), "session_app"), ((), "default")],
    ids=["application-maker", "worker-url"],
)
def test_a_worker_gives_handlers_the_application_s_sessions(
    notes: Engine,
    spawn_worker: Callable[..., WorkerProcess],
    options: tuple[str, ...],
    origin: str,
) -> None:
    """With --sessionmaker the handler's Session is the application's; without, one on the
    worker's URL. Either way the note and the job's completion commit together."""
    with Session(notes) as session, session.begin():
        jobs.enqueue(session, Note(text="a"))
        jobs.enqueue(session, Note(text="b"))
    worker = spawn_worker(*options, target=APP)
    worker.wait_logged("started")
    wait_until(lambda: len(written(notes)) == 2, "both notes written")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(DEADLINE) == 0, worker.log
    assert written(notes) == [("a", origin), ("b", origin)]
    with notes.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar_one() == 0


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("tests.acceptance.session_app:not_a_maker", "is a int, not a sessionmaker"),
        ("tests.acceptance.session_app:nope", "has no attribute 'nope'"),
        ("nomodule", "expected MODULE:ATTR"),
    ],
)
def test_a_wrong_sessionmaker_is_a_one_line_error(
    migrated_url: str, target: str, fragment: str
) -> None:
    result = run_cli("worker", APP, "--sessionmaker", target, database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, fragment)
