"""``sqla-jobs dashboard``, a real process, against a DNS-rebound page: raw requests carrying a
forged Host (and a matching Origin) get 400 and change nothing; the loopback names, the bound
port and ``--allow-host`` are answered; ``X-Forwarded-For`` from 127.0.0.1 is not believed."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from tests.acceptance._processes import dashboard

USER, PASSWORD = "ops", "correct horse battery staple"


@pytest.fixture
def default_dashboard(migrated_url: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """As a developer starts it: 127.0.0.1, no credentials, no other option."""
    log = tmp_path / "dashboard.log"
    with dashboard(migrated_url, log) as port:
        yield port, log


@pytest.fixture
def open_dashboard(migrated_url: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The default: 127.0.0.1, no credentials, and a proxy's name allowed by the environment."""
    log = tmp_path / "dashboard.log"
    env = {"SQLA_JOBS_DASHBOARD_ALLOWED_HOSTS": "jobs.example.com"}
    with dashboard(migrated_url, log, "--allow-host", "other.example:8443", env=env) as port:
        yield port, log


def request(
    port: int, method: str, path: str, headers: dict[str, str], body: str = ""
) -> tuple[int, dict[str, str], str]:
    """A raw request to 127.0.0.1:``port`` with exactly ``headers`` (Host included)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(name, value)
        conn.endheaders(body.encode() or None)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def paused(engine: Engine, queue: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT paused_at IS NOT NULL FROM sqla_jobs_queue WHERE queue = :q"),
                {"q": queue},
            ).scalar()
        )


def test_a_forged_host_gets_400_on_a_get_and_on_a_post_and_nothing_changes(
    clean: Engine, default_dashboard: tuple[int, Path]
) -> None:
    port, log = default_dashboard
    with clean.begin() as conn:
        conn.execute(
            text("INSERT INTO sqla_jobs_job (queue, kind, payload) VALUES ('mail', 'k', '{}')")
        )
        # `clean` keeps the queue table: another test of this database may have paused mail.
        conn.execute(text("DELETE FROM sqla_jobs_queue WHERE queue = 'mail'"))
    mine = {"Host": f"127.0.0.1:{port}"}
    status, headers, page = request(port, "GET", "/", mine)
    assert status == 200
    cookie = headers["set-cookie"].split(";")[0]
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert found
    forged = {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}
    status, _, body = request(port, "GET", "/", forged)
    assert (status, body) == (400, "Unknown host: this dashboard does not answer to that name.\n")
    form = f"csrf_token={found.group(1)}&next=/"
    post = {**forged, "Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
    status, _, _ = request(port, "POST", "/queues/mail/pause", post, form)
    assert status == 400
    assert not paused(clean, "mail")
    assert "event=dashboard_wrong_host" in log.read_text()
    status, _, _ = request(
        port,
        "POST",
        "/queues/mail/pause",
        {**post, **mine, "Origin": f"http://{mine['Host']}"},
        form,
    )
    assert status == 303, "the same POST to the dashboard's own name"
    assert paused(clean, "mail")


def test_the_loopback_names_with_the_port_and_the_names_given_are_answered(
    open_dashboard: tuple[int, Path],
) -> None:
    port, log = open_dashboard
    for host in (f"localhost:{port}", f"[::1]:{port}", "jobs.example.com", "other.example:8443"):
        assert request(port, "GET", "/workers", {"Host": host})[0] == 200, host
    for host in ("localhost", f"localhost.:{port}", f"jobs.example.com:{port}", f"[::2]:{port}"):
        assert request(port, "GET", "/workers", {"Host": host})[0] == 400, host
    assert "event=dashboard_hosts" in log.read_text()


def test_x_forwarded_for_is_not_believed_so_the_throttle_counts_the_real_address(
    migrated_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "dashboard.log"
    env = {"SQLA_JOBS_DASHBOARD_USER": USER, "SQLA_JOBS_DASHBOARD_PASSWORD": PASSWORD}
    with dashboard(migrated_url, log, env=env) as port:
        host = {"Host": f"127.0.0.1:{port}"}
        assert request(port, "GET", "/", host)[0] == 401, "the first challenge"
        wrong = {**host, "Authorization": "Basic b3BzOndyb25n"}  # ops:wrong
        for n in range(5):
            status, _, _ = request(port, "GET", "/", {**wrong, "X-Forwarded-For": f"192.0.2.{n}"})
            assert status == 401
        right = "Basic b3BzOmNvcnJlY3QgaG9yc2UgYmF0dGVyeSBzdGFwbGU="
        status, headers, _ = request(
            port, "GET", "/", {**host, "Authorization": right, "X-Forwarded-For": "192.0.2.99"}
        )
        assert status == 429
        assert 0 < int(headers["retry-after"]) <= 60
    logged = log.read_text()
    assert logged.count("failed sign-in from 127.0.0.1") == 5
    assert "192.0.2." not in logged
    assert PASSWORD not in logged
    assert "wrong" in logged  # "wrong password", the outcome; never what was typed
    assert "ops:wrong" not in logged
