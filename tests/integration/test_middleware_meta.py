"""A middleware registered with ``meta=True`` reads each job's meta (``ctx.meta``) on every claim
path; a worker without one never claims the column."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine

from sqla_jobs import ConfigurationError, EnqueueBatch, JobContext, Jobs, Worker

from ._workers import running_workers, wait_until
from .test_worker import enqueue, running

CallNext = Callable[[], Awaitable[None]]


class Ping(BaseModel):
    n: int = 0


class Keyed(BaseModel):
    n: int = 0


def jobs_reading_meta() -> tuple[Jobs, dict[int, Any]]:
    """Jobs whose middleware records ``ctx.meta`` by job id (a plain and a keyed kind)."""
    jobs = Jobs()
    jobs.register("ping", Ping, lambda args, ctx: None)
    jobs.register(
        "keyed",
        Keyed,
        lambda args, ctx: None,
        concurrency_key=lambda p: f"c{p.n}",
        concurrency_limit=1,
    )
    seen: dict[int, Any] = {}
    lock = threading.Lock()

    async def read(ctx: JobContext, call_next: CallNext) -> None:
        with lock:
            seen[ctx.job_id] = ctx.meta
        await call_next()

    jobs.hooks.middleware(read, meta=True)
    return jobs, seen


@pytest.mark.parametrize("listen", [True, False])
def test_a_middleware_with_meta_sees_each_jobs_meta_on_every_claim_path(
    clean: Engine, migrated_url: str, listen: bool
) -> None:
    """The plain claim (in the fetch loop, or the listener's hand-off), and the keyed claim."""
    jobs, seen = jobs_reading_meta()
    jobs.hooks.on_enqueue(lambda batch: batch.add_meta({"by": "hook"}))
    with running_workers(jobs, migrated_url, poll_interval=0.1, listen=listen) as (worker,):
        (given,) = enqueue(clean, jobs, [Ping()], meta={"tenant": "acme"})
        (keyed,) = enqueue(clean, jobs, [Keyed()], meta={"tenant": "beta"})
        wait_until(lambda: len(seen) == 2, what="both jobs ran")
    assert "sqla_jobs_job.meta" in worker._sql.claim.sql
    assert "sqla_jobs_job.meta" in worker._sql.claim_keyed.sql
    assert seen == {
        given: {"tenant": "acme", "by": "hook"},
        keyed: {"tenant": "beta", "by": "hook"},
    }


def test_a_job_without_meta_has_an_empty_one(clean: Engine, migrated_url: str) -> None:
    jobs, seen = jobs_reading_meta()
    with running_workers(jobs, migrated_url, poll_interval=0.1):
        (job_id,) = enqueue(clean, jobs, [Ping()])
        wait_until(lambda: job_id in seen, what="the job ran")
    assert seen[job_id] == {}


def test_without_a_middleware_that_reads_meta_the_claim_never_reads_it(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    jobs.register("ping", Ping, lambda args, ctx: None)
    refused: list[str] = []

    @jobs.hooks.on_enqueue
    def tag(batch: EnqueueBatch) -> None:
        batch.add_meta({"tenant": "acme"})

    @jobs.hooks.middleware
    async def read(ctx: JobContext, call_next: CallNext) -> None:
        try:
            _ = ctx.meta
        except ConfigurationError as exc:
            refused.append(str(exc))
        await call_next()

    with running_workers(jobs, migrated_url, poll_interval=0.1) as (worker,):
        enqueue(clean, jobs, [Ping()])
        wait_until(lambda: refused, what="the job ran")
    assert "meta" not in worker._sql.claim.sql
    assert "meta" not in worker._sql.claim_keyed.sql
    assert "meta=True" in refused[0]


def test_a_middleware_with_meta_registered_after_the_worker_was_created_counts(
    clean: Engine, migrated_url: str
) -> None:
    """The worker decides when it starts, from the hooks registered by then."""
    jobs = Jobs()
    jobs.register("ping", Ping, lambda args, ctx: None)
    worker = Worker(jobs, migrated_url, poll_interval=0.1)
    seen: list[Any] = []

    async def read(ctx: JobContext, call_next: CallNext) -> None:
        seen.append(ctx.meta)
        await call_next()

    jobs.hooks.middleware(read, meta=True)
    with running(worker):
        enqueue(clean, jobs, [Ping()], meta={"k": 1})
        wait_until(lambda: seen, what="the job ran")
    assert seen == [{"k": 1}]
