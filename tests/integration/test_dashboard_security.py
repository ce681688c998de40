"""The dashboard is locked by default: every state-changing request is a POST with a CSRF token
bound to the browser's cookie and from this site; with credentials every request authenticates;
read-only shows no action and refuses every POST; nothing sensitive goes into a URL."""

from __future__ import annotations

import base64
import re

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from sqla_jobs import ConfigurationError
from sqla_jobs.dashboard import create_app

from ._dashboard import add_jobs, dashboard, make_jobs, set_state, state_of, token

ACTIONS = [
    "/jobs/retry",
    "/jobs/delete",
    "/jobs/cancel",
    "/queues/mail/pause",
    "/queues/mail/resume",
]


def basic(user: str, password: str) -> dict[str, str]:
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {encoded}"}


@pytest.fixture
def dead_job(clean: Engine) -> int:
    (job_id,) = add_jobs(clean, make_jobs())
    set_state(clean, job_id, "dead")
    return job_id


def test_a_post_without_a_token_or_with_a_wrong_one_is_refused_and_changes_nothing(
    clean: Engine, dead_job: int
) -> None:
    with dashboard(clean, jobs=make_jobs()) as client:
        good = token(client)
        forms = (
            {},
            {"csrf_token": ""},
            {"csrf_token": "0" * 64},
            {"csrf_token": good[:-1]},
            {"csrf_token": "é" * 64},  # not ASCII: refused, not a server error
        )
        for form in forms:
            refused = client.post("/jobs/retry", data={**form, "job": str(dead_job)})
            assert refused.status_code == 403, form
            assert "Nothing changed: the form" in refused.text
        # A token in the URL is no token: it must come in the form.
        refused = client.post(f"/jobs/retry?csrf_token={good}", data={"job": str(dead_job)})
        assert refused.status_code == 403
    assert state_of(clean, dead_job) == ("dead", False)


def test_a_token_is_bound_to_the_cookie_of_the_browser_it_was_given_to(
    clean: Engine, dead_job: int
) -> None:
    app = create_app(clean, jobs=make_jobs())
    with TestClient(app) as victim, TestClient(app) as attacker:
        stolen = token(attacker)
        token(victim)  # the victim has a cookie of its own
        refused = victim.post("/jobs/retry", data={"csrf_token": stolen, "job": str(dead_job)})
        assert refused.status_code == 403
        attacker.cookies.clear()
        refused = attacker.post("/jobs/retry", data={"csrf_token": stolen, "job": str(dead_job)})
        assert refused.status_code == 403, "no cookie, no pass"
    assert state_of(clean, dead_job) == ("dead", False)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://testserver.evil.example"},
        {"Referer": "https://evil.example/page"},
    ],
)
def test_a_post_from_another_site_is_refused_even_with_a_valid_token(
    clean: Engine, dead_job: int, headers: dict[str, str]
) -> None:
    with dashboard(clean, jobs=make_jobs()) as client:
        form = {"csrf_token": token(client), "job": str(dead_job)}
        refused = client.post("/jobs/retry", data=form, headers=headers)
        assert refused.status_code == 403
        assert "the request came from another site" in refused.text
        assert state_of(clean, dead_job) == ("dead", False)
        same = client.post(
            "/jobs/retry",
            data=form,
            headers={"Origin": "http://testserver", "Referer": "https://evil.example/"},
            follow_redirects=False,
        )
    assert same.status_code == 303, "Origin decides when there is one"
    assert state_of(clean, dead_job) == ("pending", False)


def test_the_csrf_cookie_is_httponly_samesite_strict_and_secure_over_https(clean: Engine) -> None:
    add_jobs(clean, make_jobs())
    app = create_app(clean)
    with TestClient(app) as plain, TestClient(app, base_url="https://testserver") as tls:
        cookie = plain.get("/").headers["set-cookie"]
        secure = tls.get("/").headers["set-cookie"]
    assert re.match(r"sqla_jobs_csrf=[A-Za-z0-9_-]{43}; ", cookie)
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/" in cookie
    assert "Secure" not in cookie
    assert "Secure" in secure


def test_no_url_of_any_page_carries_the_token(clean: Engine, dead_job: int) -> None:
    with dashboard(clean, jobs=make_jobs()) as client:
        secret = token(client)
        for path in ("/", "/jobs", "/jobs?state=dead", f"/jobs/{dead_job}", "/workers"):
            urls = re.findall(r'(?:href|action|formaction)="([^"]*)"', client.get(path).text)
            assert urls
            assert not [u for u in urls if secret in u or "csrf" in u], path


def test_with_credentials_every_request_must_authenticate(clean: Engine) -> None:
    with dashboard(clean, credentials=("ops", "pa:ss wörd")) as client:
        for path in ("/", "/jobs", "/static/dashboard.css", "/nowhere"):
            refused = client.get(path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"].startswith('Basic realm="sqla-jobs')
            assert refused.headers["x-frame-options"] == "DENY"
        assert client.get("/", headers=basic("ops", "wrong")).status_code == 401
        assert client.get("/", headers=basic("nobody", "pa:ss wörd")).status_code == 401
        assert client.get("/", headers={"Authorization": "Basic !!!"}).status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer x"}).status_code == 401
        assert client.post("/jobs/retry", data={"job": "1"}).status_code == 401
        assert client.get("/", headers=basic("ops", "pa:ss wörd")).status_code == 200


def test_read_only_shows_no_action_and_refuses_every_post(clean: Engine, dead_job: int) -> None:
    jobs = make_jobs()
    (running,) = add_jobs(clean, jobs)
    set_state(clean, running, "running")
    with dashboard(clean, jobs=jobs, read_only=True) as client:
        for path in ("/", "/jobs", "/jobs?state=dead", f"/jobs/{dead_job}", f"/jobs/{running}"):
            page = client.get(path)
            assert page.status_code == 200
            assert '<form method="post"' not in page.text, path
            assert "csrf_token" not in page.text
            assert '<button class="action' not in page.text
            assert "set-cookie" not in page.headers, "no token, no cookie"
            assert '<span class="badge">read-only</span>' in page.text
        for path in ACTIONS:
            refused = client.post(path, data={"job": str(dead_job)})
            assert refused.status_code == 403, path
            assert "Nothing changed: this dashboard is read-only." in refused.text
    assert state_of(clean, dead_job) == ("dead", False)
    assert state_of(clean, running) == ("running", False)


def test_a_flash_cookie_this_app_did_not_sign_is_ignored(clean: Engine) -> None:
    forged = base64.urlsafe_b64encode(b'{"level": "ok", "text": "all good"}').decode()
    with dashboard(clean) as client:
        client.cookies.set("sqla_jobs_flash", forged.rstrip("=") + "." + "0" * 64)
        page = client.get("/")
    assert "all good" not in page.text
    assert 'sqla_jobs_flash=""' in page.headers["set-cookie"], "and cleared"


def test_apps_that_share_a_secret_accept_each_others_tokens(clean: Engine, dead_job: int) -> None:
    secret = "a shared secret of enough bytes"
    jobs = make_jobs()
    with (
        dashboard(clean, jobs=jobs, secret=secret) as one,
        dashboard(clean, jobs=jobs, secret=secret) as two,
    ):
        form = {"csrf_token": token(one), "job": str(dead_job)}
        two.cookies.update(one.cookies)
        done = two.post("/jobs/retry", data=form, follow_redirects=False)
    assert done.status_code == 303
    assert state_of(clean, dead_job) == ("pending", False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"credentials": ("", "x")}, "credentials need a user"),
        ({"credentials": ("a:b", "x")}, "credentials need a user"),
        ({"credentials": ("a", "")}, "non-empty password"),
        ({"secret": "short"}, "at least 16 bytes"),
    ],
)
def test_create_app_refuses_credentials_or_a_secret_that_cannot_protect_it(
    clean: Engine, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        create_app(clean, **options)  # type: ignore[arg-type]
