"""A dashboard given its allowed hosts answers no other name: a page whose DNS name is rebound to
this machine, sending its own Host and a matching Origin, reads nothing and changes nothing.
Failed sign-ins are throttled per address; the audit lines say which address acted."""

from __future__ import annotations

import base64
import logging

import pytest
from sqlalchemy import Engine, text

from ._dashboard import add_jobs, dashboard, make_jobs, paused, set_state, state_of, token

HOSTS = ["127.0.0.1:8000", "localhost:8000", "[::1]:8000"]
FORGED = {"Host": "attacker.example:8000", "Origin": "http://attacker.example:8000"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def unpause(engine: Engine) -> None:
    """``clean`` keeps the queue table: another test of this database may have paused mail."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_queue WHERE queue = 'mail'"))


def test_a_forged_host_and_origin_read_nothing_and_change_nothing(clean: Engine) -> None:
    jobs = make_jobs()
    add_jobs(clean, jobs)
    unpause(clean)
    with dashboard(clean, jobs=jobs, allowed_hosts=HOSTS, base_url="http://localhost:8000") as c:
        good = token(c)
        page = c.get("/", headers=FORGED)
        assert page.status_code == 400
        assert "mail" not in page.text
        refused = c.post("/queues/mail/pause", data={"csrf_token": good}, headers=FORGED)
        assert refused.status_code == 400
        assert not paused(clean, "mail")
        done = c.post("/queues/mail/pause", data={"csrf_token": good}, follow_redirects=False)
        assert done.status_code == 303, "the same POST to an allowed host"
    assert paused(clean, "mail")


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "[::1]:8000", "LOCALHOST:8000"])
def test_every_loopback_name_with_its_port_is_answered(clean: Engine, host: str) -> None:
    with dashboard(clean, allowed_hosts=HOSTS) as client:
        assert client.get("/", headers={"Host": host}).status_code == 200
        assert client.get("/", headers={"Host": "localhost:8001"}).status_code == 400


def test_a_post_must_come_from_an_allowed_origin_not_merely_the_requests_host(
    clean: Engine,
) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs)
    set_state(clean, job_id, "dead")
    with dashboard(clean, jobs=jobs, allowed_hosts=HOSTS, base_url="http://localhost:8000") as c:
        form = {"csrf_token": token(c), "job": str(job_id)}
        for origin in ("http://localhost:8001", "http://localhost", "http://attacker.example"):
            refused = c.post("/jobs/retry", data=form, headers={"Origin": origin})
            assert refused.status_code == 403, origin
            assert "the request came from another site" in refused.text
        assert state_of(clean, job_id) == ("dead", False)
        done = c.post(
            "/jobs/retry",
            data=form,
            headers={"Origin": "http://127.0.0.1:8000"},
            follow_redirects=False,
        )
    assert done.status_code == 303, "another name of the same dashboard"
    assert state_of(clean, job_id) == ("pending", False)


def test_mounted_without_a_list_it_answers_testserver_as_before(clean: Engine) -> None:
    jobs = make_jobs()
    add_jobs(clean, jobs)
    unpause(clean)
    with dashboard(clean, jobs=jobs) as client:
        done = client.post(
            "/queues/mail/pause",
            data={"csrf_token": token(client)},
            headers={"Origin": "http://testserver"},
            follow_redirects=False,
        )
    assert done.status_code == 303
    assert paused(clean, "mail")


def test_repeated_failed_sign_ins_get_429_and_are_logged_without_secrets(
    clean: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sqla_jobs.dashboard")
    with dashboard(clean, credentials=("ops", "the-password")) as client:
        assert client.get("/").status_code == 401
        for _ in range(5):
            assert client.get("/", headers=basic("ops", "hunter2")).status_code == 401
        blocked = client.get("/", headers=basic("ops", "the-password"))
    assert blocked.status_code == 429
    assert 0 < int(blocked.headers["retry-after"]) <= 60
    assert caplog.text.count("failed sign-in from testclient: wrong password") == 5
    assert "hunter2" not in caplog.text
    assert "the-password" not in caplog.text


def test_the_audit_line_of_an_action_names_the_user_and_the_client_address(
    clean: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = make_jobs()
    add_jobs(clean, jobs)
    # A re-pause says "already paused": start from no pause (``clean`` keeps the queue table).
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_queue"))
    caplog.set_level(logging.INFO, "sqla_jobs.dashboard")
    with dashboard(clean, jobs=jobs, credentials=("ops", "the-password")) as client:
        client.headers.update(basic("ops", "the-password"))
        client.post("/queues/mail/pause", data={"csrf_token": token(client)})
        client.post("/queues/mail/resume", data={"csrf_token": "0" * 64})
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_queue"))  # the refused resume left it paused
    done = [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "dashboard_pause"]
    assert done == [
        "paused queue mail: workers claim none of its jobs until it is resumed"
        " (user ops, client testclient)"
    ]
    refused = [r.getMessage() for r in caplog.records if r.event == "dashboard_refused"]  # type: ignore[attr-defined]
    assert refused == [
        "POST resume refused: the form's security token does not match"
        " (user ops, client testclient)"
    ]
