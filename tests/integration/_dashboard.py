"""Helpers of the dashboard's tests: an app on the test database behind Starlette's TestClient,
the CSRF token of a page, the flash an action left, and jobs put in a state by hand."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, text
from starlette.applications import Starlette
from starlette.testclient import TestClient

from sqla_jobs import Jobs
from sqla_jobs.dashboard import create_app

from .test_worker import enqueue

_TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')
_FLASH = re.compile(r'<p class="flash flash-(ok|error)" role="status">(.*?)</p>', re.DOTALL)


class Invoice(BaseModel):
    n: int = 0
    secret: str = "s3cr3t-payload-value"


class Report(BaseModel):
    n: int = 0


def make_jobs(schema: str | None = None) -> Jobs:
    jobs = Jobs(schema=schema)
    jobs.register("send_invoice", Invoice, queue="mail")
    jobs.register("build_report", Report, queue="reports")
    return jobs


@contextmanager
def dashboard(
    url_or_engine: str | Engine, base_url: str = "http://testserver", **options: Any
) -> Iterator[TestClient]:
    """A TestClient on ``create_app(url_or_engine, **options)`` at ``base_url``, its lifespan
    run (so an engine the app made is disposed of at the end)."""
    app: Starlette = create_app(url_or_engine, **options)
    with TestClient(app, base_url=base_url) as client:
        yield client


def token(client: TestClient, path: str = "/") -> str:
    """The CSRF token of the forms of page ``path`` (the client keeps the cookie it is bound to)."""
    page = client.get(path)
    assert page.status_code == 200, page.text
    found = _TOKEN.search(page.text)
    assert found, f"no form with a CSRF token on {path}"
    return found.group(1)


def post(client: TestClient, path: str, **form: Any) -> Any:
    """POST ``form`` with a valid token (from the queues page, which has a form as soon as a
    queue has a job), not following the redirect."""
    return client.post(path, data={"csrf_token": token(client), **form}, follow_redirects=False)


def flash(client: TestClient, response: Any) -> tuple[str, str]:
    """The flash an action's redirect leaves: (level, text) as the next page shows it."""
    assert response.status_code == 303, response.text
    page = client.get(response.headers["location"])
    found = _FLASH.search(page.text)
    assert found, f"no flash on {response.headers['location']}"
    return found.group(1), html.unescape(found.group(2))


def add_jobs(
    engine: Engine, jobs: Jobs, count: int = 1, model: type[BaseModel] = Invoice, **options: Any
) -> list[int]:
    """Enqueue ``count`` jobs of ``model`` (``send_invoice`` in queue ``mail`` by default)."""
    return enqueue(engine, jobs, [model(n=i) for i in range(count)], **options)


def set_state(engine: Engine, job_id: int, state: str, table: str = "sqla_jobs_job") -> None:
    """Put a job in ``state`` by hand, as a worker would have left it (no worker needed)."""
    extra = {
        "dead": ", attempts = 3, crashes = 1, last_error = 'SMTPServerDisconnected: closed',"
        " finished_at = now()",
        "cancelled": ", finished_at = now()",
        "completed": ", attempts = 1, finished_at = now()",
        "running": ", attempts = 1, lease_token = gen_random_uuid(), locked_by = 'host:1:abc',"
        " lease_expires_at = now() + interval '1 hour'",
        "pending": "",
    }[state]
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE {table} SET state = :state{extra} WHERE id = :id"),
            {"state": state, "id": job_id},
        )


def state_of(engine: Engine, job_id: int, table: str = "sqla_jobs_job") -> Any:
    """The job's (state, cancel requested) or None once it is gone."""
    with engine.connect() as conn:
        row = conn.execute(
            text(f"SELECT state, cancel_requested_at IS NOT NULL FROM {table} WHERE id = :id"),
            {"id": job_id},
        ).first()
    return None if row is None else (row[0], row[1])


def paused(engine: Engine, queue: str, table: str = "sqla_jobs_queue") -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(f"SELECT paused_at IS NOT NULL FROM {table} WHERE queue = :q"), {"q": queue}
            ).scalar()
        )
