"""The dashboard on a read URL while the primary fails over: one app, served in-process behind
Starlette's TestClient (as ``test_read_replicas`` drives it), on a private primary and streaming
standby (``_standby``); the primary is stopped ``-m immediate``, the standby promoted, and the same
app, never restarted, is asked for pages and an action all along.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from starlette.testclient import TestClient

from sqla_jobs.db.urls import sqlalchemy_url
from tests.integration._dashboard import add_jobs, dashboard, make_jobs, set_state, state_of
from tests.reliability._standby import DATABASE, Node, Pair
from tests.reliability.conftest import Figures, injects, scaled

#: Jobs in the table (a page of them); a third are dead, to be retried.
JOBS = scaled(30, 300)
#: The pages asked for in turn, all along.
PAGES = ("/", "/jobs", "/jobs?state=dead", "/workers", "/throughput")
#: The answers a page or an action may give: a page, an action's redirect, or a clear 503.
ALLOWED = {200, 303, 503}
_TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')
_STATE = re.compile(r'<span class="state state-(\w+)">')


def read_url(*nodes: Node) -> str:
    """A multi-host read URL that takes a standby if one answers, else whichever server does."""
    hosts = "&".join(f"host={n.host}" for n in nodes)
    return (
        f"postgresql+psycopg://postgres@/{DATABASE}?{hosts}"
        "&target_session_attrs=prefer-standby&connect_timeout=5"
    )


class Asker:
    """Asks the app for pages and a retry, and keeps every answer: (path, status, at)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.answers: list[tuple[str, int, float]] = []
        self._turn = 0

    def page(self) -> int:
        path = PAGES[self._turn % len(PAGES)]
        self._turn += 1
        return self._ask(path, lambda: self.client.get(path)).status_code

    def retry(self, job_id: int) -> Any:
        """POST a retry of ``job_id`` with the token of a page (None: no page to take it from)."""
        page = self._ask("/", lambda: self.client.get("/"))
        found = _TOKEN.search(page.text)
        if page.status_code != 200 or found is None:
            return None
        form = {"csrf_token": found.group(1), "job": str(job_id), "next": f"/jobs/{job_id}"}
        return self._ask(
            "POST /jobs/retry",
            lambda: self.client.post("/jobs/retry", data=form, follow_redirects=False),
        )

    def _ask(self, what: str, call: Any) -> Any:
        answer = call()
        self.answers.append((what, answer.status_code, time.monotonic()))
        assert answer.status_code in ALLOWED, f"{what}: {answer.status_code}\n{answer.text}"
        return answer

    def first_ok_after(self, at: float, what: str) -> float | None:
        """Seconds from ``at`` to the first answer to ``what`` ("page" or "action") that was OK."""
        for path, status, when in self.answers:
            ok = status == 303 if path.startswith("POST") else status == 200
            kind = "action" if path.startswith("POST") else "page"
            if when >= at and ok and kind == what:
                return round(when - at, 3)
        return None


@injects(
    "async replication; dashboard with read_url=prefer-standby over both servers; primary "
    "stopped -m immediate, standby promoted while pages and a retry are asked for"
)
def test_the_dashboard_on_a_read_url_answers_through_a_failover(
    ha_pair: Pair, figures: Figures, caplog: pytest.LogCaptureFixture
) -> None:
    """Dashboard on a read URL through a failover: pages answer all along (503 at worst, never a
    500), and after the promotion an action works on the new primary with the app not restarted

    What an operator configures: the app's URL is the multi-host URL of both servers with
    ``target_session_attrs=read-write`` (actions follow the primary wherever it is), and the read
    URL names both servers too, with ``prefer-standby``: reads go to whichever server is a standby,
    fall back to the primary when there is none (right after a failover, before the old primary
    is rebuilt as a standby), and need no change of configuration when the roles swap. A read URL
    naming only the standby would keep reading the new primary after the promotion and never the
    rebuilt standby.
    """
    caplog.set_level(logging.WARNING)
    pair = ha_pair
    jobs = make_jobs()
    engine = create_engine(sqlalchemy_url(pair.primary.url()), poolclass=NullPool)
    try:
        ids = add_jobs(engine, jobs, JOBS)
        dead = ids[::3]
        for job_id in dead:
            set_state(engine, job_id, "dead")
    finally:
        engine.dispose()
    pair.wait_replayed()
    app_url = pair.url() + "&connect_timeout=5"
    with dashboard(app_url, jobs=jobs, read_url=read_url(pair.standby, pair.primary)) as client:
        ask = Asker(client)
        for _ in PAGES:
            assert ask.page() == 200
        before = client.get("/jobs")
        assert "Read from the replica, at WAL position" in before.text

        pair.primary.stop("immediate")
        # The gap: no primary. Pages still read the standby; an action has nowhere to write.
        for _ in PAGES:
            ask.page()
        in_gap = ask.retry(dead[0])
        assert in_gap is not None
        assert in_gap.status_code == 503, in_gap.text
        assert "Database unavailable" in in_gap.text
        assert state_of_standby(pair, dead[0]) == "dead"

        promoted: list[float] = []
        promoter = threading.Thread(
            target=lambda: (pair.standby.promote(), promoted.append(time.monotonic())),
            name="promote",
        )
        promoter.start()
        while promoter.is_alive():
            ask.page()
        promoter.join()
        assert promoted, "the standby was not promoted"
        at = promoted[0]

        deadline = at + 30
        done = None
        while done is None or done.status_code != 303:
            assert time.monotonic() < deadline, f"no action worked in 30 s: {ask.answers[-5:]}"
            ask.page()
            done = ask.retry(dead[0])
        after = client.get(done.headers["location"])
        assert after.status_code == 200, after.text
        assert _STATE.findall(after.text) == ["pending"], after.text
        for _ in PAGES:
            assert ask.page() == 200

    new_primary = create_engine(sqlalchemy_url(pair.standby.url()), poolclass=NullPool)
    try:
        assert state_of(new_primary, dead[0]) == ("pending", False)
    finally:
        new_primary.dispose()
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert not tracebacks, tracebacks
    pages = [s for p, s, _ in ask.answers if not p.startswith("POST")]
    actions = [s for p, s, _ in ask.answers if p.startswith("POST")]
    figures.record(
        jobs=JOBS,
        first_page_ok_after_promotion_s=ask.first_ok_after(at, "page"),
        first_action_ok_after_promotion_s=ask.first_ok_after(at, "action"),
        pages=len(pages),
        pages_not_200=sum(s != 200 for s in pages),
        actions=len(actions),
        actions_not_ok=sum(s != 303 for s in actions),
    )


def state_of_standby(pair: Pair, job_id: int) -> Any:
    return pair.standby.sql("SELECT state FROM sqla_jobs_job WHERE id = %s", (job_id,))
