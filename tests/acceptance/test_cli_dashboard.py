"""``sqla-jobs dashboard``, a real process: locked to this machine unless credentials are set,
credentials from the environment only, and a log that names the actions taken, never a secret."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from sqlalchemy import Engine, text

from tests.acceptance._processes import REPO, cli_env, dashboard, run_cli

USER, PASSWORD = "ops", "correct horse battery staple"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "dashboard.example"])
def test_a_bind_beyond_this_machine_without_credentials_is_refused(
    migrated_url: str, host: str
) -> None:
    result = run_cli("dashboard", "--host", host, database_url=migrated_url)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"sqla-jobs: error: refusing to serve the dashboard on {host} without credentials: set "
        "SQLA_JOBS_DASHBOARD_USER and SQLA_JOBS_DASHBOARD_PASSWORD, or bind 127.0.0.1"
    ]


def test_a_user_without_a_password_is_a_usage_error(migrated_url: str) -> None:
    env = {**cli_env(migrated_url), "SQLA_JOBS_DASHBOARD_USER": USER}
    result = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", "dashboard", "--host", "0.0.0.0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "sqla-jobs: error: set both SQLA_JOBS_DASHBOARD_USER and SQLA_JOBS_DASHBOARD_PASSWORD, "
        "or neither"
    )


def test_the_password_is_never_a_flag(migrated_url: str) -> None:
    result = run_cli("dashboard", "--help", database_url=migrated_url)
    assert result.returncode == 0
    assert "--password" not in result.stdout
    assert "--user" not in result.stdout


@pytest.fixture
def served(migrated_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``sqla-jobs dashboard --port 0`` with credentials, on every interface; its base URL and
    its log. Stopped with SIGTERM at the end, which must exit 0."""
    log = tmp_path / "dashboard.log"
    env = {"SQLA_JOBS_DASHBOARD_USER": USER, "SQLA_JOBS_DASHBOARD_PASSWORD": PASSWORD}
    with dashboard(migrated_url, log, "--host", "0.0.0.0", env=env) as port:
        yield f"http://127.0.0.1:{port}", log


def test_it_serves_only_authenticated_requests_and_logs_actions_without_secrets(
    clean: Engine, served: tuple[str, Path]
) -> None:
    base, log = served
    with clean.begin() as conn:
        conn.execute(
            text("INSERT INTO sqla_jobs_job (queue, kind, payload) VALUES ('mail', 'k', '{}')")
        )
    assert httpx2.get(f"{base}/").status_code == 401
    assert httpx2.get(f"{base}/", auth=(USER, "wrong")).status_code == 401
    with httpx2.Client(base_url=base, auth=(USER, PASSWORD)) as client:
        page = client.get("/")
        assert page.status_code == 200
        found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
        assert found
        done = client.post("/queues/mail/pause", data={"csrf_token": found.group(1), "next": "/"})
        assert done.status_code == 303
        refused = client.post("/queues/mail/resume", data={"csrf_token": "0" * 64})
        assert refused.status_code == 403
    text_logged = log.read_text()
    assert "event=dashboard_started" in text_logged
    assert "event=dashboard_plain_http" in text_logged, "a warning: Basic auth without TLS"
    assert "event=dashboard_proxy_addresses" in text_logged, "a warning: one address for all"
    assert re.search(
        r"event=dashboard_pause msg=\"paused queue mail: .* \(user ops, client 127\.0\.0\.1\)\"",
        text_logged,
    )
    assert "event=dashboard_refused" in text_logged
    assert PASSWORD not in text_logged
    assert found.group(1) not in text_logged
    assert "GET /" not in text_logged, "no access log"
