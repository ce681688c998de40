"""Rate limits: exact across workers by the database's clock, per kind and per key; the next start
on time without polling; other kinds and keys served meanwhile."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, RateLimit
from sqla_jobs.cli.entry import main

from ._rate_limits import busiest_window, claim_count, claims, listening, recorded_claims
from ._workers import queue_empty, running_workers, wait_until

#: The poll interval of these workers: far longer than any wait the tests allow, so polling can
#: explain no start.
POLL = 30.0


class Call(BaseModel):
    n: int
    key: str = "a"


class Free(BaseModel):
    n: int


def test_no_window_holds_more_than_the_limit_across_workers(
    clean: Engine, migrated_url: str
) -> None:
    per = timedelta(seconds=1)
    jobs = Jobs()

    @jobs.kind("limited", Call, rate_limit=RateLimit(3, per=per))
    def limited(p: Call, ctx: JobContext) -> None:
        pass

    @jobs.kind("per_key", Free, rate_limit=RateLimit(2, per=per, by=lambda p: f"k{p.n % 2}"))
    def per_key(p: Free, ctx: JobContext) -> None:
        pass

    with recorded_claims(clean):
        with Session(clean) as s, s.begin():
            jobs.enqueue_many(s, [Call(n=i) for i in range(10)])
            jobs.enqueue_many(s, [Free(n=i) for i in range(10)])
        with running_workers(jobs, migrated_url, count=3, concurrency=4, poll_interval=POLL):
            wait_until(queue_empty(clean), 60, "every limited job to run")
        started = claims(clean)
    assert sorted(started) == ["limited", "per_key k0", "per_key k1"]
    assert len(started["limited"]) == 10
    assert busiest_window(started["limited"], per) == 3
    for key in ("per_key k0", "per_key k1"):
        assert len(started[key]) == 5
        assert busiest_window(started[key], per) == 2


def test_the_next_start_comes_when_the_window_allows_not_at_the_poll(
    clean: Engine, migrated_url: str
) -> None:
    per = timedelta(seconds=1.5)
    jobs = Jobs()

    @jobs.kind("limited", Call, rate_limit=RateLimit(2, per=per))
    def limited(p: Call, ctx: JobContext) -> None:
        pass

    with recorded_claims(clean):
        with Session(clean) as s, s.begin():
            jobs.enqueue_many(s, [Call(n=i) for i in range(5)])
        with running_workers(jobs, migrated_url, count=2, concurrency=2, poll_interval=POLL):
            wait_until(queue_empty(clean), 30, "every limited job to run")
        started = claims(clean)["limited"]
    assert len(started) == 5
    # Start k + 2 may come once start k leaves the window: never before, and not a poll later.
    for k in range(3):
        allowed = started[k] + per
        assert started[k + 2] >= allowed
        assert started[k + 2] - allowed < timedelta(seconds=1), (k, started)


def test_keys_are_independent_and_an_unlimited_kind_is_served_meanwhile(
    clean: Engine, migrated_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    per = timedelta(seconds=60)
    jobs = Jobs()
    done = threading.Event()
    free_runs: list[int] = []

    @jobs.kind("limited", Call, rate_limit=RateLimit(1, per=per, by=lambda p: p.key))
    def limited(p: Call, ctx: JobContext) -> None:
        pass

    @jobs.kind("free", Free)
    def free(p: Free, ctx: JobContext) -> None:
        free_runs.append(p.n)
        if len(free_runs) == 20:
            done.set()

    with recorded_claims(clean):
        with Session(clean) as s, s.begin():
            # Key a saturated for a minute, with jobs waiting behind its first; key b one job.
            jobs.enqueue_many(s, [Call(n=i, key="a") for i in range(5)])
            jobs.enqueue(s, Call(n=9, key="b"))
        with running_workers(
            jobs, migrated_url, count=2, concurrency=2, poll_interval=POLL
        ) as workers:
            listening(workers)
            wait_until(lambda: claim_count(clean) == 2, 30, "one start of each key")
            with Session(clean) as s, s.begin():
                jobs.enqueue_many(s, [Free(n=i) for i in range(20)])
            assert done.wait(30), "the unlimited kind did not run while a limit held"
        started = claims(clean)
    assert len(started["limited a"]) == 1
    assert len(started["limited b"]) == 1
    with clean.connect() as conn:
        waiting = conn.execute(
            text("SELECT count(*), max(attempts) FROM sqla_jobs_job WHERE state = 'pending'")
        ).one()
    # Held by the limit: still pending, and no attempt spent.
    assert tuple(waiting) == (4, 0)
    # What an operator sees: each key's limit, its window's use, and its next start.
    capsys.readouterr()
    assert main(["rate-limits", "--database-url", migrated_url, "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["kind"], r["key"], r["limit"], r["used"]) for r in shown] == [
        ("limited", "a", 1, 1),
        ("limited", "b", 1, 1),
    ]
    assert all(50 < r["next_start_in_seconds"] <= 60 for r in shown)


def test_a_backlog_under_its_limit_runs_as_slots_free_not_at_the_poll(
    clean: Engine, migrated_url: str
) -> None:
    """Limited jobs are claimed only for free slots; a backlog the limit lets through is claimed
    again as each slot frees, not four jobs per poll (40 jobs here would take ten 30 s polls)."""
    jobs = Jobs()

    @jobs.kind("roomy", Call, rate_limit=RateLimit(1000, per=timedelta(seconds=1)))
    def roomy(p: Call, ctx: JobContext) -> None:
        pass

    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Call(n=i) for i in range(40)])
    with running_workers(jobs, migrated_url, count=1, concurrency=4, poll_interval=POLL):
        wait_until(queue_empty(clean), 20, "the backlog to run before the second poll")
