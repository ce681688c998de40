"""The dashboard on the least-privilege roles of docs/roles.md: its actions connect as the
operator, its read-only mode as the reader; a role without a privilege gets a clear message,
never an error page, and nothing changes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from sqla_jobs import Jobs
from sqla_jobs.db.urls import sqlalchemy_url
from tests.reliability import test_roles as doc
from tests.reliability.test_roles import Roles

from ._dashboard import add_jobs, dashboard, flash, make_jobs, paused, post, set_state, state_of

#: The roles and grants of docs/roles.md, made as the page says: that test's fixtures, reused.
doc_sql = doc.doc_sql
doc_roles = doc.roles


@pytest.fixture(scope="module")
def admin(migrated_url: str) -> Iterator[Engine]:
    """A superuser's engine, to set jobs up in the roles' schema as a worker would leave them."""
    engine = create_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
    yield engine
    engine.dispose()


def test_the_operator_role_retries_deletes_cancels_and_pauses_through_the_dashboard(
    doc_roles: Roles, admin: Engine
) -> None:
    jobs = make_jobs(doc_roles.schema)
    table = f"{doc_roles.schema}.sqla_jobs_job"
    dead, gone, pending, busy = add_jobs(admin, jobs, 4)
    for job_id, state in ((dead, "dead"), (gone, "dead"), (busy, "running")):
        set_state(admin, job_id, state, table)
    with dashboard(doc_roles.url("operator"), jobs=jobs) as client:
        pages = ("/", "/jobs", "/jobs?state=dead", f"/jobs/{dead}", "/workers", "/throughput")
        for path in pages:
            assert client.get(path).status_code == 200, path
        assert flash(client, post(client, "/jobs/retry", job=str(dead)))[0] == "ok"
        assert flash(client, post(client, "/jobs/delete", job=str(gone)))[0] == "ok"
        assert flash(client, post(client, "/jobs/cancel", ids=[str(pending), str(busy)]))[0] == "ok"
        assert flash(client, post(client, "/queues/mail/pause"))[0] == "ok"
        assert paused(admin, "mail", f"{doc_roles.schema}.sqla_jobs_queue")
        assert flash(client, post(client, "/queues/mail/resume"))[0] == "ok"
    assert state_of(admin, dead, table) == ("pending", False)
    assert state_of(admin, gone, table) is None
    assert state_of(admin, pending, table) == ("cancelled", False)
    assert state_of(admin, busy, table) == ("running", True)


def test_the_reader_role_serves_every_page_read_only(doc_roles: Roles, admin: Engine) -> None:
    (job_id,) = add_jobs(admin, make_jobs(doc_roles.schema))
    # As `sqla-jobs dashboard --schema` makes it: a Jobs that knows its schema and no kind.
    jobs = Jobs(schema=doc_roles.schema)
    with dashboard(doc_roles.url("reader"), jobs=jobs, read_only=True) as client:
        pages = ("/", "/jobs", "/jobs?state=running", f"/jobs/{job_id}", "/workers", "/throughput")
        for path in pages:
            page = client.get(path)
            assert page.status_code == 200, path
            assert "csrf_token" not in page.text


def test_a_role_without_the_privilege_gets_a_flash_and_nothing_changes(
    doc_roles: Roles, admin: Engine
) -> None:
    jobs = make_jobs(doc_roles.schema)
    table = f"{doc_roles.schema}.sqla_jobs_job"
    (job_id,) = add_jobs(admin, jobs)
    set_state(admin, job_id, "dead", table)
    # The reader's connection with the actions shown: PostgreSQL refuses them.
    with dashboard(doc_roles.url("reader"), jobs=jobs) as client:
        level, said = flash(client, post(client, "/jobs/retry", job=str(job_id)))
        assert level == "error"
        assert said.startswith("retry: the dashboard's database role may not do this (permission")
        assert said.endswith(
            "the operator role of docs/roles.md, or run it read-only. Nothing changed."
        )
        level, said = flash(client, post(client, "/queues/mail/pause"))
        assert level == "error"
        assert "permission denied for table sqla_jobs_queue" in said
    assert state_of(admin, job_id, table) == ("dead", False)
