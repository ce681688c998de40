"""Which actions each page offers: only those the operation accepts for the jobs shown
(:mod:`sqla_jobs.operations.jobs`), on the rows, in the bulk bar under a listing and on a job's
page; a read-only dashboard offers none."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine

from sqla_jobs.operations.jobs import CANCELLABLE, DELETABLE, RETRYABLE

from ._dashboard import add_jobs, dashboard, make_jobs, set_state

#: The states each verb of the dashboard applies to, as the operations say.
ACCEPTS = {"retry": RETRYABLE, "delete": DELETABLE, "cancel": CANCELLABLE}
#: What a listing of one state offers, on each row and for the ticked jobs.
OFFERED = {
    "pending": ["cancel"],
    "running": ["cancel"],
    "dead": ["retry", "delete"],
    "cancelled": ["retry", "delete"],
    "completed": ["delete"],
}


def bulk(page: str) -> list[str]:
    """The verbs of the bar under a listing, for the ticked jobs ([] when there is none)."""
    bar = re.search(r'<p class="bulk">(.*?)</p>', page, re.S)
    return [] if bar is None else re.findall(r'class="action action-(\w+)"', bar.group(1))


def on_rows(page: str) -> list[list[str]]:
    """The verbs of each row's buttons, row by row."""
    cells = re.findall(r'<td class="actions">(.*?)</td>', page, re.S)
    return [re.findall(r'class="action action-(\w+)"', cell) for cell in cells]


def job_buttons(page: str) -> list[str]:
    found = re.search(r'<div class="job-actions">(.*?)</div>', page, re.S)
    return [] if found is None else re.findall(r'class="action action-(\w+)"', found.group(1))


@pytest.mark.parametrize("state", list(OFFERED))
def test_a_listing_of_one_state_offers_only_the_actions_that_apply_to_it(
    clean: Engine, state: str
) -> None:
    """The Dead page offers no Cancel, the Running page no Retry nor Delete: neither on the rows
    nor for the ticked jobs; and every verb offered is one the operation accepts."""
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs, 1)
    set_state(clean, job_id, state)
    with dashboard(clean, jobs=jobs) as client:
        page = client.get(f"/jobs?state={state}").text
    assert on_rows(page) == [OFFERED[state]]
    assert bulk(page) == OFFERED[state]
    assert all(state in ACCEPTS[verb] for verb in OFFERED[state])


@pytest.mark.parametrize("state", list(OFFERED))
def test_a_jobs_page_offers_only_the_actions_that_apply_to_its_state(
    clean: Engine, state: str
) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs, 1)
    set_state(clean, job_id, state)
    with dashboard(clean, jobs=jobs) as client:
        page = client.get(f"/jobs/{job_id}").text
    assert job_buttons(page) == OFFERED[state]


def test_a_listing_of_every_state_offers_what_applies_to_some_job_shown(clean: Engine) -> None:
    """Without a state filter, the bar offers each action that applies to at least one of the
    jobs listed (the operation refuses a ticked job it does not apply to, by name)."""
    jobs = make_jobs()
    dead, running = add_jobs(clean, jobs, 2)
    set_state(clean, dead, "dead")
    set_state(clean, running, "running")
    with dashboard(clean, jobs=jobs) as client:
        mixed = client.get("/jobs").text
        set_state(clean, dead, "running")
        only_running = client.get("/jobs").text
    assert bulk(mixed) == ["retry", "delete", "cancel"]
    assert bulk(only_running) == ["cancel"]


def test_a_read_only_dashboard_offers_no_action(clean: Engine) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(clean, jobs, 1)
    set_state(clean, job_id, "dead")
    with dashboard(clean, jobs=jobs, read_only=True) as client:
        listing = client.get("/jobs?state=dead").text
        one = client.get(f"/jobs/{job_id}").text
    assert (bulk(listing), on_rows(listing), job_buttons(one)) == ([], [], [])
    assert 'type="checkbox"' not in listing
