"""The registry of live workers tells a dead worker from a live one by its heartbeats: stale once it
missed two of them, well before its jobs' leases end, never while it beats, however loaded; a
running job of a stale worker is marked on the dashboard's Running page."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs
from sqla_jobs.worker.config import WorkerSeams
from tests._waiting import wait_until
from tests.integration._dashboard import add_jobs, dashboard, make_jobs
from tests.integration._workers import running_workers


class Spin(BaseModel):
    seconds: float = 0.0


def workers(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
            r.name: r
            for r in conn.execute(
                text("SELECT name, expires_at < now() AS stale FROM sqla_jobs_worker")
            )
        }


@pytest.fixture
def quiet(clean: Engine) -> Engine:
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_worker, sqla_jobs_queue"))
    return clean


def spinning_jobs(release: threading.Event | None = None) -> Jobs:
    jobs = Jobs()

    @jobs.kind("spin", Spin, queue="reg")
    def spin(args: Spin, ctx: JobContext) -> None:
        # CPU, holding the GIL most of the time: the heartbeat thread competes for it.
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            sum(range(1000))
        if release is not None:
            release.wait(60)

    return jobs


def enqueue(engine: Engine, jobs: Jobs, n: int, seconds: float) -> None:
    with Session(engine) as session:
        jobs.enqueue_many(session, [Spin(seconds=seconds) for _ in range(n)])
        session.commit()


def test_a_worker_whose_heartbeats_stop_is_stale_after_two_missed_beats_long_before_its_lease_ends(
    quiet: Engine, migrated_url: str
) -> None:
    release = threading.Event()
    jobs = spinning_jobs(release)
    enqueue(quiet, jobs, 1, 0.0)
    frozen = threading.Event()
    beat, lease = 0.5, 30.0
    try:
        with running_workers(
            jobs,
            migrated_url,
            queues=["reg"],
            lease=lease,
            heartbeat=beat,
            poll_interval=0.1,
            seams=WorkerSeams(heartbeats_paused=frozen),
        ) as [worker]:
            wait_until(lambda: worker.holdings.running, "the job runs")
            assert not workers(quiet)[worker.name].stale
            frozen.set()
            wait_until(
                lambda: workers(quiet)[worker.name].stale,
                "the worker is stale",
                timeout=2.5 * beat + 10.0,
            )
            with quiet.connect() as conn:
                left = conn.execute(
                    text("SELECT min(lease_expires_at - now()) FROM sqla_jobs_job")
                ).scalar_one()
            # On the database clock: the lease still holds, so "stale" came from the beats.
            assert left.total_seconds() > 0
            frozen.clear()
            wait_until(lambda: not workers(quiet)[worker.name].stale, "it beats again")
            release.set()
    finally:
        release.set()


def test_a_live_worker_is_never_stale_under_load(quiet: Engine, migrated_url: str) -> None:
    """Four handlers spinning on the CPU, the row read again and again for six seconds (six
    beats): never stale. A beat would have to be late by a beat and a half to make it so."""
    jobs = spinning_jobs()
    enqueue(quiet, jobs, 40, 0.5)
    seen: list[bool] = []
    with running_workers(
        jobs, migrated_url, queues=["reg"], concurrency=4, lease=3.0, heartbeat=1.0
    ) as [worker]:
        wait_until(lambda: worker.holdings.running, "the jobs run")
        end = time.monotonic() + 6.0
        while time.monotonic() < end:
            seen.append(workers(quiet)[worker.name].stale)
            time.sleep(0.05)  # a sampling rate over a fixed window: what must not happen
    assert seen
    assert not any(seen), f"stale in {sum(seen)} of {len(seen)} reads"


def test_the_running_page_marks_a_job_whose_worker_is_stale(quiet: Engine) -> None:
    jobs = make_jobs()
    dead_one, live_one = add_jobs(quiet, jobs, 2)
    inserted = time.monotonic()
    with quiet.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_worker (name, host, pid, queues, concurrency, heartbeat_at,"
                " expires_at) VALUES ('gone', 'h', 1, '{mail}', 4, now() - interval '41 seconds',"
                " now() - interval '1 second'), ('here', 'h', 2, '{mail}', 4, now(),"
                " now() + interval '1 minute')"
            )
        )
        for job_id, worker in ((dead_one, "gone"), (live_one, "here")):
            conn.execute(
                text(
                    "UPDATE sqla_jobs_job SET state = 'running', attempts = 1, locked_by = :w, "
                    "lease_token = gen_random_uuid(), lease_expires_at = now() + interval '19 s' "
                    "WHERE id = :id"
                ),
                {"w": worker, "id": job_id},
            )
    with dashboard(quiet, jobs=jobs) as client:
        page = client.get("/jobs", params={"state": "running"})
    # The age is read when the page renders: 41 s plus however long this test took to get there
    # (on a loaded machine, more than the half second that rounds 41 up to 42).
    waited = time.monotonic() - inserted
    assert page.status_code == 200
    marks = page.text.count("running on a stale worker")
    assert marks == 1, page.text
    found = re.search(r"running on a stale worker \(gone, no heartbeat for (\d+)s\)", page.text)
    assert found is not None, page.text
    assert 41 <= int(found.group(1)) <= round(41 + waited) + 1
