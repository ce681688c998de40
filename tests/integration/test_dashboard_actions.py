"""The dashboard's actions, through Starlette's TestClient on a real database: retry, delete and
cancel jobs, pause and resume a queue; each a POST that redirects back (303) with a flash, and a
refused operation a flash with nothing changed."""

from __future__ import annotations

import re

from sqlalchemy import Engine, text

from ._dashboard import add_jobs, dashboard, flash, make_jobs, paused, post, set_state, state_of


def test_retry_puts_a_dead_job_back_in_the_queue(clean: Engine) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs)
    set_state(clean, job_id, "dead")
    with dashboard(clean, jobs=jobs) as client:
        done = post(client, "/jobs/retry", job=str(job_id), next=f"/jobs/{job_id}")
        assert done.headers["location"] == f"/jobs/{job_id}"
        assert flash(client, done) == ("ok", f"retried 1 job: {job_id}")
    assert state_of(clean, job_id) == ("pending", False)


def test_delete_removes_a_dead_job_and_returns_to_the_listing(clean: Engine) -> None:
    jobs = make_jobs()
    (job_id, kept) = add_jobs(clean, jobs, 2)
    set_state(clean, job_id, "dead")
    set_state(clean, kept, "dead")
    with dashboard(clean, jobs=jobs) as client:
        detail = client.get(f"/jobs/{job_id}").text
        assert '<input type="hidden" name="next" value="/jobs?state=dead">' in detail
        done = post(client, "/jobs/delete", job=str(job_id), next="/jobs?state=dead")
        assert flash(client, done) == ("ok", f"deleted 1 job: {job_id}")
    assert state_of(clean, job_id) is None
    assert state_of(clean, kept) == ("dead", False)


def test_cancel_cancels_a_pending_job_and_asks_a_running_ones_worker(clean: Engine) -> None:
    jobs = make_jobs()
    (pending, busy) = add_jobs(clean, jobs, 2)
    set_state(clean, busy, "running")
    with dashboard(clean, jobs=jobs) as client:
        done = post(client, "/jobs/cancel", job=str(pending))
        assert flash(client, done) == ("ok", f"cancelled 1 pending job: {pending}")
        done = post(client, "/jobs/cancel", job=str(busy))
        assert flash(client, done) == (
            "ok",
            f"asked the workers to stop 1 running job: {busy}"
            " (an async handler is cancelled at once and the job ends cancelled; a sync handler is "
            "told through ctx.cancelled: its job ends cancelled if it stops by raising, and completes "
            "if it returns)",
        )
        page = client.get("/jobs?state=running").text
    assert state_of(clean, pending) == ("cancelled", False)
    assert state_of(clean, busy) == ("running", True), "running until its handler stops"
    assert '<span class="note">cancel requested</span>' in page


def test_the_ticked_jobs_are_retried_together(clean: Engine) -> None:
    jobs = make_jobs()
    made = add_jobs(clean, jobs, 3)
    for job_id in made:
        set_state(clean, job_id, "dead")
    with dashboard(clean, jobs=jobs) as client:
        done = post(client, "/jobs/retry", ids=[str(i) for i in made[:2]], next="/jobs?state=dead")
        assert flash(client, done) == ("ok", f"retried 2 jobs: {made[0]}, {made[1]}")
    assert [state_of(clean, i) for i in made] == [
        ("pending", False),
        ("pending", False),
        ("dead", False),
    ]


def test_pause_and_resume_a_queue(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_queue"))
    add_jobs(clean, make_jobs())
    with dashboard(clean) as client:
        done = post(client, "/queues/mail/pause")
        assert flash(client, done) == (
            "ok",
            "paused queue mail: workers claim none of its jobs until it is resumed",
        )
        assert paused(clean, "mail")
        page = client.get("/").text
        assert 'action="/queues/mail/resume"' in page
        done = post(client, "/queues/mail/resume")
        assert flash(client, done) == ("ok", "resumed queue mail")
    assert not paused(clean, "mail")


def test_a_forged_pause_of_a_queue_the_page_does_not_list_is_refused(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_queue"))
    add_jobs(clean, make_jobs())
    with dashboard(clean) as client:
        done = post(client, "/queues/alpah/pause")
        level, message = flash(client, done)
        assert level == "error"
        assert message.startswith("unknown queue 'alpah'")
        # Earlier tests in this database may have left queues of their own (throughput rows).
        known = re.search(r"known queues: ([^)]*)\)", message)
        assert known is not None, message
        assert "mail" in known.group(1).split(", "), message
        assert not paused(clean, "alpah")
        post(client, "/queues/mail/pause")
        again = post(client, "/queues/mail/pause")
        assert flash(client, again)[1].startswith("queue mail is already paused (since ")
        post(client, "/queues/mail/resume")
        done = post(client, "/queues/mail/resume")
        assert flash(client, done) == ("ok", "queue mail was not paused")
    with clean.begin() as conn:
        assert conn.execute(text("SELECT queue FROM sqla_jobs_queue")).scalars().all() == ["mail"]


def test_an_operation_refused_by_the_api_is_a_flash_and_changes_nothing(clean: Engine) -> None:
    jobs = make_jobs()
    (dead, busy) = add_jobs(clean, jobs, 2)
    set_state(clean, dead, "dead")
    set_state(clean, busy, "running")
    with dashboard(clean, jobs=jobs) as client:
        done = post(client, "/jobs/retry", ids=[str(dead), str(busy)])
        assert flash(client, done) == (
            "error",
            f"cannot retry: job {busy} is running (retry applies to dead, cancelled, pending "
            "jobs): nothing changed",
        )
        done = post(client, "/jobs/cancel", job=str(dead))
        level, said = flash(client, done)
        assert level == "error"
        assert said.startswith(f"cannot cancel: job {dead} is dead")
        done = post(client, "/jobs/delete", job="999999999")
        assert flash(client, done) == ("error", "no job with id 999999999: nothing changed")
    assert state_of(clean, dead) == ("dead", False)
    assert state_of(clean, busy) == ("running", False)


def test_bad_input_in_a_form_is_a_flash_not_an_error_page(clean: Engine) -> None:
    add_jobs(clean, make_jobs())  # a queue, so that the queues page has a form
    with dashboard(clean) as client:
        done = post(client, "/jobs/retry")
        assert flash(client, done) == (
            "error",
            "retry: no job selected: tick the jobs first: nothing changed",
        )
        done = post(client, "/jobs/retry", job="-3")
        assert flash(client, done)[0] == "error"
        done = post(client, "/queues/bad name!/pause")
        level, said = flash(client, done)
    assert level == "error"
    assert "invalid queue name" in said


def test_an_action_redirects_only_to_a_path_of_the_dashboard(clean: Engine) -> None:
    add_jobs(clean, make_jobs())  # a queue, so that the queues page has a form
    with dashboard(clean) as client:
        for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "jobs"):
            done = post(client, "/queues/mail/resume", next=target)
            assert done.headers["location"] == "/", target


def test_an_unknown_action_is_not_found(clean: Engine) -> None:
    add_jobs(clean, make_jobs())  # a queue, so that the queues page has a form
    with dashboard(clean) as client:
        assert post(client, "/jobs/destroy", job="1").status_code == 404
        assert post(client, "/queues/mail/drop").status_code == 404
        assert client.get("/jobs/retry").status_code == 405, "a GET changes nothing"
