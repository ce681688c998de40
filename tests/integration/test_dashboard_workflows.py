"""The dashboard on job dependencies: a job's page lists its parents and children with their
states, each linked to its own page, and how many parents a waiting job still waits on; the
listing filters on the waiting state."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Jobs

from ._dashboard import dashboard, make_jobs, set_state


def _enqueue(engine: Engine, jobs: Jobs, n: int, **options: Any) -> int:
    with Session(engine) as session:
        job = jobs.enqueue(session, "send_invoice", {"n": n}, delay=3600, **options)
        job_id: int = job.id
        session.commit()
    return job_id


def _rows(page: str, title: str) -> list[tuple[int, str]]:
    """(id, state) of each row of the page's table under ``<h3>title``."""
    section = page.split(f"<h3>{title}", 1)[1].split("</table>", 1)[0]
    found = re.findall(
        r'<a href="/jobs/(\d+)">\d+</a></td>\s*<td>[^<]*</td>\s*<td><span class="state state-(\w+)"',
        section,
    )
    return [(int(i), s) for i, s in found]


def test_a_waiting_jobs_page_lists_its_parents_linked_and_how_many_it_waits_on(
    clean: Engine,
) -> None:
    jobs = make_jobs()
    first, second, third = (_enqueue(clean, jobs, n) for n in range(3))
    child = _enqueue(clean, jobs, 9, depends_on=[first, second, third], on_parent_failure="run")
    set_state(clean, second, "dead")
    with clean.begin() as conn:
        # The third ended and its row went (a completion): the page shows the recorded outcome.
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'running', lease_token = gen_random_uuid(),"
                " lease_expires_at = now() WHERE id = :id"
            ),
            {"id": third},
        )
        conn.execute(text("DELETE FROM sqla_jobs_job WHERE id = :id"), {"id": third})
    with dashboard(clean, jobs=jobs) as client:
        page = client.get(f"/jobs/{child}").text
        parent_page = client.get(f"/jobs/{first}").text
        alone = client.get(f"/jobs/{_enqueue(clean, jobs, 5)}").text
    assert "Waiting on 1 parent." in page
    assert _rows(page, "Parents") == [(first, "pending"), (second, "dead"), (third, "completed")]
    assert "row gone" in page
    assert "runs anyway" in page
    assert "<h3>Children" not in page
    assert _rows(parent_page, "Children") == [(child, "waiting")]
    assert "Waiting on" not in parent_page
    assert "<h2>Dependencies</h2>" not in alone


def test_the_jobs_listing_filters_on_the_waiting_state(clean: Engine) -> None:
    jobs = make_jobs()
    parent = _enqueue(clean, jobs, 0)
    child = _enqueue(clean, jobs, 1, depends_on=[parent])
    with dashboard(clean, jobs=jobs) as client:
        waiting = client.get("/jobs?state=waiting")
        pending = client.get("/jobs?state=pending").text
    assert waiting.status_code == 200
    assert "<h1>Waiting jobs</h1>" in waiting.text
    listed = [int(i) for i in re.findall(r'<td class="num"><a href="/jobs/(\d+)">', waiting.text)]
    assert listed == [child]
    assert f'<a href="/jobs/{child}">' not in pending
    assert f'<a href="/jobs/{parent}">' in pending
