"""Rate limits with the rest: a concurrency limit on the same kind (both hold), a paused queue
(nothing starts, and the limit is kept after the resume), idle limiters pruned, and what a worker
of the version before rate limits does with a limited job (it claims it, unlimited)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from datetime import timedelta

import psycopg
from pydantic import BaseModel
from sqlalchemy import Engine, text, update
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, RateLimit, Retention, testing
from sqla_jobs.db.connections import Connector
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql import claim as claim_sql
from sqla_jobs.sql.claimed import mark_claimed
from sqla_jobs.sql.compiled import compile_statement
from sqla_jobs.sql.scans import due_now
from sqla_jobs.sql.tables import job
from sqla_jobs.worker.pruner import RATE_LIMITERS, Pruner

from ._rate_limits import busiest_window, claim_count, claims, listening, recorded_claims
from ._workers import queue_empty, running_workers, wait_until

POLL = 30.0


class Call(BaseModel):
    n: int
    customer: str = "c1"


class Free(BaseModel):
    n: int


def test_a_kind_with_both_limits_keeps_both(clean: Engine, migrated_url: str) -> None:
    per = timedelta(seconds=60)
    jobs = Jobs()
    runs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    lock = threading.Lock()

    @jobs.kind(
        "both",
        Call,
        rate_limit=RateLimit(4, per=per),
        concurrency_key=lambda p: p.customer,
        concurrency_limit=1,
    )
    def both(p: Call, ctx: JobContext) -> None:
        start = time.monotonic()
        time.sleep(0.05)  # the handler's work: long enough for two of a key to overlap
        with lock:
            runs[p.customer].append((start, time.monotonic()))

    with recorded_claims(clean):
        with Session(clean) as s, s.begin():
            jobs.enqueue_many(s, [Call(n=i, customer="c1") for i in range(3)])
            jobs.enqueue_many(s, [Call(n=i, customer="c2") for i in range(3)])
        with running_workers(jobs, migrated_url, count=2, concurrency=4, poll_interval=POLL):
            wait_until(lambda: sum(len(r) for r in runs.values()) == 4, 30, "four runs")
        started = claims(clean)["both"]
    assert len(started) == 4  # the rate limit: four starts a minute
    for key, intervals in runs.items():
        ordered = sorted(intervals)
        # The concurrency limit: one run of a key at a time.
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered)), key
    with clean.connect() as conn:
        left = conn.execute(
            text("SELECT count(*), max(attempts) FROM sqla_jobs_job WHERE state = 'pending'")
        ).one()
    assert tuple(left) == (2, 0)


def test_a_paused_queue_starts_nothing_and_the_limit_holds_after_the_resume(
    clean: Engine, migrated_url: str
) -> None:
    per = timedelta(seconds=1)
    jobs = Jobs()
    done = threading.Event()

    @jobs.kind("limited", Call, queue="limited", rate_limit=RateLimit(2, per=per))
    def limited(p: Call, ctx: JobContext) -> None:
        pass

    @jobs.kind("free", Free, queue="free")
    def free(p: Free, ctx: JobContext) -> None:
        done.set()

    try:
        with recorded_claims(clean):
            with Session(clean) as s, s.begin():
                jobs.pause_queue(s, "limited")
                jobs.enqueue_many(s, [Call(n=i) for i in range(5)])
            with running_workers(
                jobs, migrated_url, count=1, queues=["limited", "free"], poll_interval=POLL
            ) as workers:
                listening(workers)
                with Session(clean) as s, s.begin():
                    jobs.enqueue(s, Free(n=1))
                # The worker has claimed since (the free job), and nothing of the paused queue.
                assert done.wait(30)
                assert claim_count(clean) == 1
                with Session(clean) as s, s.begin():
                    jobs.resume_queue(s, "limited")
                wait_until(queue_empty(clean), 30, "the limited jobs to run after the resume")
            started = claims(clean)["limited"]
    finally:
        with clean.begin() as conn:
            conn.execute(text("DELETE FROM sqla_jobs_queue"))
    assert len(started) == 5
    assert busiest_window(started, per) == 2


def test_idle_limiters_are_pruned_and_busy_ones_kept(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()

    @jobs.kind(
        "brief",
        Call,
        rate_limit=RateLimit(5, per=timedelta(milliseconds=50), by=lambda p: p.customer),
    )
    def brief(p: Call, ctx: JobContext) -> None:
        pass

    @jobs.kind("long", Free, rate_limit=RateLimit(5, per=timedelta(minutes=10)))
    def long(p: Free, ctx: JobContext) -> None:
        pass

    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Call(n=i, customer=f"c{i}") for i in range(3)])
        jobs.enqueue(s, Free(n=1))
    with running_workers(jobs, migrated_url, count=1, poll_interval=POLL):
        wait_until(queue_empty(clean), 30, "every job to run")

    def limiters() -> set[str]:
        with clean.connect() as conn:
            return set(conn.execute(text("SELECT rate_key FROM sqla_jobs_rate_limiter")).scalars())

    assert limiters() == {"brief c0", "brief c1", "brief c2", "long"}
    with clean.connect() as conn:
        # Waits on the database's clock for the short windows to pass; the long one has 10 min.
        wait_until(
            lambda: (
                conn.execute(
                    text(
                        "SELECT count(*) FROM sqla_jobs_rate_limiter WHERE free_at < clock_timestamp()"
                    )
                ).scalar_one()
                == 3
            ),
            10,
            "the short windows to pass",
        )
    connector = Connector(libpq_conninfo(migrated_url), "t")
    pruner = Pruner(connector=connector, schema=None, retention=Retention(), interval=60)
    try:
        counts = pruner.prune_once()
    finally:
        pruner._close()
    assert counts is not None
    assert counts[RATE_LIMITERS] == 3
    assert limiters() == {"long"}


def test_a_worker_before_rate_limits_claims_a_limited_job_as_if_unlimited(
    clean: Engine, migrated_url: str
) -> None:
    """What docs/rate-limits.md says: the claim of a worker of an earlier version does not know
    rate_key, so it takes limited jobs without counting them. Its claim is this claim without
    the rate_key filter."""
    jobs = Jobs()
    jobs.register("limited", Call, rate_limit=RateLimit(1, per=timedelta(minutes=10)))
    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Call(n=i) for i in range(3)])
    old = mark_claimed(
        update(job).where(*claim_sql._unkeyed_pick(due_now(), True)),
        False,
        False,
    )
    stmt = compile_statement(old, None)
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as conn:
        rows = conn.execute(
            stmt.sql,
            stmt.params(queue="default", limit=10, lease=timedelta(minutes=1), worker="old"),
        ).fetchall()
        logged = conn.execute("SELECT count(*) FROM sqla_jobs_rate_limiter").fetchone()
    assert len(rows) == 3  # all three, over a limit of one: the limit is not kept
    assert logged == (0,)  # and their starts are not logged


def test_run_jobs_of_a_test_runs_rate_limited_jobs_without_their_limit(clean: Engine) -> None:
    """What docs/rate-limits.md says: inline runs ignore rate limits (keyed or not), and keep
    concurrency limits."""
    jobs = Jobs()
    ran: list[int] = []
    jobs.register(
        "limited",
        Call,
        lambda p, ctx: ran.append(p.n),
        rate_limit=RateLimit(1, per=timedelta(hours=1)),
    )
    jobs.register(
        "both",
        Free,
        lambda p, ctx: ran.append(p.n),
        rate_limit=RateLimit(1, per=timedelta(hours=1)),
        concurrency_key=lambda p: "k",
    )
    with Session(clean) as session, session.begin():
        jobs.enqueue_many(session, [Call(n=i) for i in range(3)])
        jobs.enqueue_many(session, [Free(n=10 + i) for i in range(2)])
        # One claim per call, as for any keyed kind: the key's second job waits for the next.
        assert testing.run_jobs(jobs, session).done == 4
        assert testing.run_jobs(jobs, session).done == 1
        session.rollback()
    assert sorted(ran) == [0, 1, 2, 10, 11]
