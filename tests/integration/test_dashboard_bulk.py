"""The dashboard's actions by filter (every dead job of a queue, every pending and running one):
a first POST counts and asks on a server-rendered page, changing nothing; the page's second POST,
signed and bound to what was counted, runs it; a tampered, foreign or stale confirmation changes
nothing."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from sqla_jobs.dashboard import _bulk

from ._dashboard import (
    Report,
    add_jobs,
    dashboard,
    flash,
    make_jobs,
    post,
    set_state,
    state_of,
    token,
)

_CONFIRM_FORM = re.compile(r'<form method="post" action="([^"]+/matching)">(.*?)</form>', re.DOTALL)
_HIDDEN = re.compile(r'<input type="hidden" name="(\w+)" value="([^"]*)">')


def confirmation(page: Any) -> tuple[str, dict[str, str]]:
    """The confirmation page's form: where it posts, and its fields."""
    assert page.status_code in (200, 409), page.text
    found = _CONFIRM_FORM.search(page.text)
    assert found, page.text
    return found.group(1), {k: html.unescape(v) for k, v in _HIDDEN.findall(found.group(2))}


def dead_jobs(engine: Engine, count: int, **options: Any) -> list[int]:
    jobs = make_jobs()
    made = add_jobs(engine, jobs, count, **options)
    for job_id in made:
        set_state(engine, job_id, "dead")
    return made


def states(engine: Engine, ids: list[int]) -> list[Any]:
    return [None if (s := state_of(engine, i)) is None else s[0] for i in ids]


def text_of(page: Any) -> str:
    return html.unescape(re.sub(r"\s+", " ", page.text))


def test_a_retry_by_filter_first_shows_the_count_and_changes_nothing_then_runs_once_confirmed(
    clean: Engine,
) -> None:
    mail = dead_jobs(clean, 3)
    other = dead_jobs(clean, 1, model=Report)
    with dashboard(clean, jobs=make_jobs()) as client:
        listing = client.get("/jobs?state=dead&queue=mail").text
        assert 'formaction="/jobs/retry/matching"' in listing
        asked = post(client, "/jobs/retry/matching", queue="mail", next="/jobs?state=dead")
        assert asked.status_code == 200
        said = text_of(asked)
        assert "Retry 3 dead jobs?" in said
        assert f"this retry touches ids {', '.join(map(str, mail))}" in said
        assert "(queue mail, any kind) matches 3 jobs" in said
        assert "<script" not in asked.text
        assert states(clean, mail + other) == ["dead"] * 4, "the first POST changes nothing"

        action, fields = confirmation(asked)
        done = client.post(action, data=fields, follow_redirects=False)
        assert flash(client, done) == ("ok", f"retried 3 jobs: {', '.join(map(str, mail))}")
        assert done.headers["location"] == "/jobs?state=dead"
    assert states(clean, mail + other) == ["pending"] * 3 + ["dead"]


@pytest.mark.parametrize("verb", ["delete", "cancel"])
def test_delete_and_cancel_by_filter_run_once_confirmed(clean: Engine, verb: str) -> None:
    jobs = make_jobs()
    made = add_jobs(clean, jobs, 2)
    if verb == "delete":
        for job_id in made:
            set_state(clean, job_id, "dead")
    else:
        set_state(clean, made[1], "running")
    with dashboard(clean, jobs=jobs) as client:
        asked = post(client, f"/jobs/{verb}/matching", queue="mail")
        said = "2 dead jobs" if verb == "delete" else "1 pending job and 1 running job"
        assert f"{verb.capitalize()} {said}?" in text_of(asked)
        before = [state_of(clean, i) for i in made]
        assert before == [("dead" if verb == "delete" else "pending", False), before[1]]
        action, fields = confirmation(asked)
        done = client.post(action, data=fields, follow_redirects=False)
        assert flash(client, done)[0] == "ok"
    if verb == "delete":
        assert states(clean, made) == [None, None]
    else:
        assert [state_of(clean, i) for i in made] == [("cancelled", False), ("running", True)]


def test_a_confirmed_run_leaves_alone_the_jobs_that_match_after_the_count(clean: Engine) -> None:
    counted = dead_jobs(clean, 2)
    with dashboard(clean, jobs=make_jobs()) as client:
        action, fields = confirmation(post(client, "/jobs/retry/matching", queue="mail"))
        later = dead_jobs(clean, 1)
        done = client.post(action, data=fields, follow_redirects=False)
        assert flash(client, done) == ("ok", f"retried 2 jobs: {counted[0]}, {counted[1]}")
    assert states(clean, counted + later) == ["pending", "pending", "dead"]


def test_when_more_jobs_match_within_the_count_than_were_confirmed_it_asks_again(
    clean: Engine,
) -> None:
    first, middle, last = dead_jobs(clean, 3)
    set_state(clean, middle, "pending")
    with dashboard(clean, jobs=make_jobs()) as client:
        action, fields = confirmation(post(client, "/jobs/retry/matching", queue="mail"))
        assert fields["counted"] == "2"
        set_state(clean, middle, "dead")
        stale = client.post(action, data=fields, follow_redirects=False)
        assert stale.status_code == 409
        assert "not the ones you confirmed: nothing changed" in text_of(stale)
        assert states(clean, [first, middle, last]) == ["dead"] * 3
        action, fields = confirmation(stale)
        assert fields["counted"] == "3"
        done = client.post(action, data=fields, follow_redirects=False)
        assert flash(client, done)[0] == "ok"
    assert states(clean, [first, middle, last]) == ["pending"] * 3


def test_a_job_swapped_in_for_a_counted_one_is_not_touched(clean: Engine) -> None:
    """As many jobs match as were counted, but not the same ones: one counted was retried,
    another (with a lower id) died since. Nothing runs; the page asks again."""
    first, second, third = dead_jobs(clean, 3)
    set_state(clean, first, "pending")
    with dashboard(clean, jobs=make_jobs()) as client:
        action, fields = confirmation(post(client, "/jobs/delete/matching", queue="mail"))
        assert fields["counted"] == "2"
        set_state(clean, first, "dead")
        set_state(clean, third, "pending")
        stale = client.post(action, data=fields, follow_redirects=False)
        assert stale.status_code == 409
    assert states(clean, [first, second, third]) == ["dead", "dead", "pending"]


def test_a_confirmation_older_than_ten_minutes_counts_again(
    clean: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = dead_jobs(clean, 2)
    with dashboard(clean, jobs=make_jobs()) as client:
        action, fields = confirmation(post(client, "/jobs/retry/matching", queue="mail"))
        later = _bulk._clock() + _bulk.FRESH + 1
        monkeypatch.setattr(_bulk, "_clock", lambda: later)
        stale = client.post(action, data=fields, follow_redirects=False)
        assert stale.status_code == 409
        assert "more than 10 minutes old: nothing changed" in text_of(stale)
    assert states(clean, made) == ["dead", "dead"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("counted", "3"),
        ("max_id", "999999"),
        ("queue", ""),
        ("confirm", "0" * 64),
        ("digest", "0" * 32),
        ("issued", "1"),
    ],
)
def test_a_tampered_confirmation_is_refused_and_changes_nothing(
    clean: Engine, field: str, value: str
) -> None:
    made = dead_jobs(clean, 2)
    with dashboard(clean, jobs=make_jobs()) as client:
        action, fields = confirmation(post(client, "/jobs/retry/matching", queue="mail"))
        refused = client.post(action, data={**fields, field: value}, follow_redirects=False)
        assert refused.status_code == 403
        assert "the confirmation does not match what was counted" in text_of(refused)
    assert states(clean, made) == ["dead", "dead"]


def test_a_confirmation_signed_for_another_browser_is_refused(clean: Engine) -> None:
    made = dead_jobs(clean, 2)
    with dashboard(clean, jobs=make_jobs()) as client:
        action, fields = confirmation(post(client, "/jobs/retry/matching", queue="mail"))
        other = TestClient(client.app, base_url="http://testserver")
        refused = other.post(
            action, data={**fields, "csrf_token": token(other)}, follow_redirects=False
        )
        assert refused.status_code == 403
    assert states(clean, made) == ["dead", "dead"]


def test_both_posts_need_the_csrf_token_and_a_read_only_dashboard_refuses_them(
    clean: Engine,
) -> None:
    made = dead_jobs(clean, 2)
    with dashboard(clean, jobs=make_jobs()) as client:
        token(client)
        first = client.post("/jobs/retry/matching", data={"queue": "mail"})
        assert first.status_code == 403
        assert "Retry 2" not in first.text
        action, fields = confirmation(post(client, "/jobs/retry/matching", queue="mail"))
        del fields["csrf_token"]
        assert client.post(action, data=fields, follow_redirects=False).status_code == 403
    with dashboard(clean, jobs=make_jobs(), read_only=True) as client:
        assert "/matching" not in client.get("/jobs?state=dead").text
        refused = client.post("/jobs/retry/matching", data={"queue": "mail"})
        assert refused.status_code == 403
    assert states(clean, made) == ["dead", "dead"]


def test_cancel_by_filter_needs_a_queue(clean: Engine) -> None:
    (pending,) = add_jobs(clean, make_jobs())
    with dashboard(clean, jobs=make_jobs()) as client:
        done = post(client, "/jobs/cancel/matching", next="/jobs")
        assert flash(client, done) == (
            "error",
            "cancel: cancel every job of a filter needs a queue: nothing changed",
        )
    assert state_of(clean, pending) == ("pending", False)


def test_the_confirmation_says_the_per_run_cap_plainly(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload, state, attempts, finished_at) "
                "SELECT 'mail', 'send_invoice', '{}', 'dead', 1, now() "
                "FROM generate_series(1, 10003)"
            )
        )
    with dashboard(clean, jobs=make_jobs()) as client:
        asked = post(client, "/jobs/delete/matching")
        said = text_of(asked)
        assert "(any queue, any kind) matches 10,003 jobs" in said
        assert "10,000 of 10,003 matching jobs: this run touches the first 10,000" in said
        assert confirmation(asked)[1]["counted"] == "10000"
