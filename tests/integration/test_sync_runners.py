"""Sync handlers run on dedicated threads; a handler stuck past its timeout costs no capacity."""

from __future__ import annotations

import threading

from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs

from ._workers import running_workers, wait_until


class Stuck(BaseModel):
    n: int


class Quick(BaseModel):
    n: int


def test_a_timed_out_sync_handler_does_not_take_the_workers_only_slot_forever(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    release = threading.Event()
    quick_ran = threading.Event()

    @jobs.kind("stuck", Stuck, timeout=0.3, max_attempts=1)
    def stuck(args: Stuck, ctx: JobContext) -> None:
        release.wait(30)  # ignores its timeout, as blocking sync code does

    @jobs.kind("quick", Quick)
    def quick(args: Quick, ctx: JobContext) -> None:
        quick_ran.set()

    with Session(clean) as s, s.begin():
        jobs.enqueue(s, Stuck(n=1), priority=-1)
        jobs.enqueue(s, Quick(n=1))
    try:
        with running_workers(jobs, migrated_url, concurrency=1, poll_interval=0.1, lease=3):
            # The stuck handler still blocks its thread, yet the next job runs on a replacement.
            assert quick_ran.wait(10), "the quick job never ran: the stuck thread kept the slot"
            wait_until(
                lambda: _state(clean, "stuck") == ("dead", "timed out after 0.3s"),
                what="the stuck job to be dead after its timeout",
            )
    finally:
        release.set()


def _state(engine: Engine, kind: str) -> tuple[str, str] | None:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, last_error FROM sqla_jobs_job WHERE kind = :k"), {"k": kind}
        ).first()
    return None if row is None else (row[0], row[1])
