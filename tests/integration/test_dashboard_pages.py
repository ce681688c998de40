"""The dashboard's pages, read through Starlette's TestClient from a real database: queues, jobs
by state, queue and kind (paged by id), one job, search by id, the live workers."""

from __future__ import annotations

import html
import re
import socket

import pytest
from sqlalchemy import Engine, text
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from sqla_jobs.dashboard import create_app
from sqla_jobs.dashboard._reads import PAGE_SIZE

from ._dashboard import Report, add_jobs, dashboard, make_jobs, set_state, token


def ids_listed(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<td class="num"><a href="/jobs/(\d+)">', page)]


def test_queues_page_shows_depth_by_state_oldest_due_and_pause(clean: Engine) -> None:
    jobs = make_jobs()
    mail = add_jobs(clean, jobs, 4)
    set_state(clean, mail[0], "dead")
    with clean.begin() as conn:
        # A job waiting for its parents (job dependencies) has a column of its own.
        conn.execute(
            text("UPDATE sqla_jobs_job SET state = 'waiting', waiting_on = 1 WHERE id = :id"),
            {"id": mail[3]},
        )
        conn.execute(text("TRUNCATE sqla_jobs_queue"))
        conn.execute(text("UPDATE sqla_jobs_job SET run_at = now() - interval '5 minutes'"))
        conn.execute(text("INSERT INTO sqla_jobs_queue (queue, paused_at) VALUES ('idle', now())"))
        conn.execute(text("DELETE FROM sqla_jobs_worker"))
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_worker (name, host, pid, queues, concurrency, expires_at)"
                " VALUES ('w1', 'box', 1, '{mail}', 8, now() + interval '1 minute')"
            )
        )
    try:
        with dashboard(clean, jobs=jobs) as client:
            page = client.get("/")
    finally:
        with clean.begin() as conn:
            conn.execute(text("DELETE FROM sqla_jobs_worker"))
    assert page.status_code == 200
    row = re.search(
        r'<th scope="row"><a href="/jobs\?queue=mail">mail</a></th>(.*?)</tr>', page.text, re.S
    )
    assert row, page.text
    cells = re.findall(r'<td class="num[^"]*">(?:<a [^>]*>)?(\d+)', row.group(1))
    assert cells[:7] == ["2", "0", "1", "0", "0", "1", "1"], "by state, then the live workers"
    assert 'title="8 handler slots"' in row.group(1)
    assert "5.0m" in row.group(1), "the oldest due job's age"
    assert 'href="/jobs?queue=mail&amp;state=dead"' in row.group(1)
    idle = re.search(
        r'<tr class="paused">\s*<th scope="row"><a href="/jobs\?queue=idle">', page.text
    )
    assert idle, "a paused queue without jobs is listed, marked paused"
    assert "Resume</button>" in page.text
    assert "Pause</button>" in page.text
    assert '<a href="/jobs?kind=send_invoice">send_invoice</a>' in page.text


def test_jobs_page_filters_by_state_queue_and_kind(clean: Engine) -> None:
    jobs = make_jobs()
    (mail_dead, mail_pending) = add_jobs(clean, jobs, 2)
    (report,) = add_jobs(clean, jobs, 1, Report)
    set_state(clean, mail_dead, "dead")
    with dashboard(clean, jobs=jobs) as client:
        assert ids_listed(client.get("/jobs").text) == [report, mail_pending, mail_dead]
        dead = client.get("/jobs?state=dead")
        assert ids_listed(dead.text) == [mail_dead]
        assert "<h1>Dead jobs</h1>" in dead.text
        assert 'href="/jobs?state=dead" aria-current="page"' in dead.text
        assert ids_listed(client.get("/jobs?queue=reports").text) == [report]
        assert ids_listed(client.get("/jobs?kind=send_invoice&state=pending").text) == [
            mail_pending
        ]
        refused = client.get("/jobs?state=bogus")
    assert refused.status_code == 400
    assert "invalid state &#39;bogus&#39;: use pending, running, dead, completed, cancelled" in (
        refused.text
    )


def test_jobs_page_pages_by_id_below_the_last_one_shown(clean: Engine) -> None:
    jobs = make_jobs()
    made = add_jobs(clean, jobs, PAGE_SIZE + 5)
    newest_first = sorted(made, reverse=True)
    with dashboard(clean, jobs=jobs) as client:
        first = client.get("/jobs?queue=mail")
        assert ids_listed(first.text) == newest_first[:PAGE_SIZE]
        older = re.search(r'<a rel="next" href="([^"]+)">Older', first.text)
        assert older, "a link to the next page"
        link = html.unescape(older.group(1))
        assert link == f"/jobs?queue=mail&before={newest_first[PAGE_SIZE - 1]}"
        # A job enqueued meanwhile does not shift the next page (it is not OFFSET).
        add_jobs(clean, jobs, 1)
        second = client.get(link)
    assert ids_listed(second.text) == newest_first[PAGE_SIZE:]
    assert 'rel="next"' not in second.text, "the last page links no further"
    assert '<a href="/jobs?queue=mail">« Newest</a>' in second.text


def test_job_page_shows_counters_error_steps_meta_and_hides_the_payload(clean: Engine) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs, 1, meta={"tenant": "acme"})
    set_state(clean, job_id, "dead")
    with clean.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET steps = CAST(:steps AS jsonb),"
                " last_error = '<script>alert(1)</script>', errors = CAST(:errors AS jsonb)"
                " WHERE id = :id"
            ),
            {
                "id": job_id,
                "steps": '{"charged": {"card": "4242"}}',
                "errors": '[{"attempt": 3, "at": "2026-12-01T07:06:23+00:00", "error": "OSError",'
                ' "message": "closed", "traceback": "Traceback (most recent call last): ..."}]',
            },
        )
    with dashboard(clean, jobs=jobs) as client:
        page = client.get(f"/jobs/{job_id}").text
    assert f'<h1>Job {job_id} <span class="state state-dead">dead</span></h1>' in page
    assert "<dt>Attempts</dt><dd>3 of 10</dd>" in page
    assert "<dt>Crashes</dt><dd>1 of 3</dd>" in page
    assert '<pre class="error">&lt;script&gt;alert(1)&lt;/script&gt;</pre>' in page
    assert "<script>" not in page, "a job's error is text, never markup"
    assert "<tr><td>charged</td></tr>" in page, "step names, not their results"
    assert "4242" not in page
    assert "<dt>tenant</dt><dd><code>&#34;acme&#34;</code></dd>" in page
    assert "<strong>OSError</strong>: closed" in page
    assert "Traceback (most recent call last)" in page
    assert "s3cr3t-payload-value" not in page
    assert "Hidden: payloads may hold personal data" in page
    assert ">Retry</button>" in page
    assert ">Delete</button>" in page
    assert ">Cancel</button>" not in page


def test_job_page_shows_the_payload_and_step_results_only_with_show_payload(
    clean: Engine,
) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs, 1)
    with clean.begin() as conn:
        conn.execute(
            text("UPDATE sqla_jobs_job SET steps = '{\"charged\": 4242}' WHERE id = :id"),
            {"id": job_id},
        )
    with dashboard(clean, jobs=jobs, show_payload=True) as client:
        page = client.get(f"/jobs/{job_id}").text
    assert "s3cr3t-payload-value" in page
    assert "<td><code>4242</code></td>" in page
    assert ">Cancel</button>" in page, "a pending job can be cancelled"


def test_search_by_id_opens_the_job_or_says_it_is_not_found(clean: Engine) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs, 1)
    with dashboard(clean, jobs=jobs) as client:
        found = client.get(f"/search?id={job_id}", follow_redirects=False)
        assert (found.status_code, found.headers["location"]) == (303, f"/jobs/{job_id}")
        missing = client.get(f"/search?id={job_id + 1000}")
        assert missing.status_code == 404
        assert f"No job has id {job_id + 1000}" in missing.text
        assert client.get(f"/jobs/{job_id + 1000}").status_code == 404
        bad = client.get("/search?id=abc")
    assert bad.status_code == 400
    assert "invalid job id &#39;abc&#39;: ids are whole numbers from 1" in bad.text


def test_workers_page_lists_the_registered_workers(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_worker"))
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_worker (name, host, pid, queues, concurrency, expires_at)"
                " VALUES ('box:4242:abcdef', 'box', 4242, '{mail,reports}', 8,"
                " now() + interval '1 minute')"
            )
        )
    try:
        with dashboard(clean) as client:
            page = client.get("/workers").text
    finally:
        with clean.begin() as conn:
            conn.execute(text("DELETE FROM sqla_jobs_worker"))
    assert "<td>box:4242:abcdef</td>" in page
    assert '<td class="num">4242</td>' in page
    assert '<a href="/jobs?queue=mail">mail</a>, <a href="/jobs?queue=reports">reports</a>' in page


def test_empty_database_pages_say_so(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_queue, sqla_jobs_worker"))
    with dashboard(clean) as client:
        assert "No queue has jobs" in client.get("/").text
        assert "No jobs." in client.get("/jobs").text
        assert "No worker is registered" in client.get("/workers").text


def test_mounted_under_a_prefix_its_links_cookies_and_redirects_stay_under_it(
    clean: Engine,
) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs, 1)
    outer = Starlette(routes=[Mount("/ops/jobs", app=create_app(clean, jobs=jobs))])
    with TestClient(outer) as client:
        page = client.get("/ops/jobs/")
        assert page.status_code == 200
        assert 'href="/ops/jobs/static/dashboard.css"' in page.text
        assert 'href="/ops/jobs/jobs?queue=mail"' in page.text
        assert "Path=/ops/jobs" in page.headers["set-cookie"]
        assert client.get("/ops/jobs/static/dashboard.css").status_code == 200
        found = client.get(f"/ops/jobs/search?id={job_id}", follow_redirects=False)
        assert found.headers["location"] == f"/ops/jobs/jobs/{job_id}"
        form = token(client, "/ops/jobs/")
        done = client.post(
            "/ops/jobs/queues/mail/pause",
            data={"csrf_token": form, "next": "/jobs?queue=mail"},
            follow_redirects=False,
        )
    assert (done.status_code, done.headers["location"]) == (303, "/ops/jobs/jobs?queue=mail")


@pytest.mark.parametrize(
    "path", ["/", "/jobs", "/workers", "/nowhere", "/static/dashboard.css", "/favicon.ico"]
)
def test_every_response_forbids_framing_scripts_and_caching(clean: Engine, path: str) -> None:
    with dashboard(clean) as client:
        response = client.get(path)
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["content-security-policy"].startswith("default-src 'self'")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["referrer-policy"] == "same-origin"
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-content-type-options"] == "nosniff"


def test_an_unreachable_database_is_a_clear_503_page_not_a_500_with_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A primary that is down (failing over, restarting): the pages say so (the actions too:
    tests/reliability/test_dashboard_failover.py)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once the socket is closed
    url = f"postgresql://postgres@127.0.0.1:{port}/nowhere?connect_timeout=2"
    with dashboard(url, jobs=make_jobs()) as client:
        answers = [client.get("/"), client.get("/jobs/1")]
    for page in answers:
        assert page.status_code == 503, page.text
        assert "Database unavailable" in page.text
        assert "cannot reach the database: connection failed" in html.unescape(page.text)
    assert not [r for r in caplog.records if r.exc_info]
