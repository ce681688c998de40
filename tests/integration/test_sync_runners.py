"""Sync handlers run on dedicated threads; a handler past its timeout keeps its slot (its thread
cannot be stopped) until it returns, and no longer."""

from __future__ import annotations

import threading

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs
from tests._waiting import DEADLINE

from ._workers import running_workers, wait_until


class Stuck(BaseModel):
    n: int


class Quick(BaseModel):
    n: int


def test_a_timed_out_sync_handler_keeps_the_only_slot_until_it_returns_then_frees_it(
    clean: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = Jobs()
    release = threading.Event()
    quick_ran = threading.Event()

    @jobs.kind("stuck", Stuck, timeout=0.3, max_attempts=1)
    def stuck(args: Stuck, ctx: JobContext) -> None:
        release.wait(DEADLINE)  # ignores its timeout, as blocking sync code does

    @jobs.kind("quick", Quick)
    def quick(args: Quick, ctx: JobContext) -> None:
        quick_ran.set()

    with Session(clean) as s, s.begin():
        jobs.enqueue(s, Stuck(n=1), priority=-1)
        jobs.enqueue(s, Quick(n=1))
    try:
        with running_workers(jobs, migrated_url, concurrency=1, poll_interval=0.1, lease=3):
            wait_until(
                lambda: any(getattr(r, "event", "") == "timeout_overrun" for r in caplog.records),
                what="the worker to see the handler pass its timeout",
            )
            assert _state(clean, "stuck") == ("running", None)
            assert not quick_ran.is_set(), "a second handler ran beside the one in the only slot"
            release.set()
            assert quick_ran.wait(DEADLINE), "the quick job never ran once the slot was free"
            wait_until(
                lambda: (_state(clean, "stuck") or ("", ""))[0] == "dead",
                what="the stuck job to be dead after its timeout",
            )
            state = _state(clean, "stuck")
            assert state is not None
            assert state[1].startswith("timed out after 0.3s (the sync handler returned ")
    finally:
        release.set()


def _state(engine: Engine, kind: str) -> tuple[str, str] | None:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, last_error FROM sqla_jobs_job WHERE kind = :k"), {"k": kind}
        ).first()
    return None if row is None else (row[0], row[1])
