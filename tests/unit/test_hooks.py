"""The hooks' pure parts, without a database: how an EnqueueBatch merges meta, how an outcome is
named, how the middleware chain nests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone

import pytest

from sqla_jobs import InvalidMetaError, JobContext
from sqla_jobs._outcome import Outcome
from sqla_jobs.context import ClaimedJob
from sqla_jobs.hooks import EnqueueBatch, _name_of, run_middleware

from ._claimed import claimed_job


def batch(texts: list[str | None]) -> EnqueueBatch:
    return EnqueueBatch(["k"] * len(texts), ["q"] * len(texts), texts)


def test_add_meta_merges_into_each_jobs_meta_and_keeps_jobs_without_meta_apart() -> None:
    b = batch(['{"a":1,"t":"old"}', None, '{"a":1,"t":"old"}'])
    b.add_meta({"t": "new"})
    assert [json.loads(t) for t in b._result() or []] == [
        {"a": 1, "t": "new"},
        {"t": "new"},
        {"a": 1, "t": "new"},
    ]


def test_a_batch_no_hook_changed_reports_no_change() -> None:
    b = batch(['{"a":1}', None])
    assert b.metas == [{"a": 1}, {}]
    assert b._result() == ['{"a":1}', None], "jobs without meta keep NULL"


def test_one_jobs_meta_changes_alone_and_bad_meta_names_its_position() -> None:
    b = EnqueueBatch(["k"] * 2, ["q"] * 2, [None, None], first=1024)
    b.metas[1]["x"] = 1
    assert b._result() == [None, '{"x":1}']
    b.metas[0]["bad"] = float("nan")
    with pytest.raises(InvalidMetaError, match="meta of job 1024 after on_enqueue"):
        b._result()


def claimed(attempts: int, max_attempts: int, crashes: int = 0) -> ClaimedJob:
    return claimed_job(attempts=attempts, max_attempts=max_attempts, crashes=crashes)


def test_outcomes_are_named_as_the_fail_statement_decides() -> None:
    job = claimed(attempts=1, max_attempts=2)
    assert _name_of(Outcome(job)) == "completed"
    assert _name_of(Outcome(job, error="x")) == "failed"
    assert _name_of(Outcome(job, error="x", dead=True)) == "dead"
    assert _name_of(Outcome(claimed(2, 2), error="x")) == "dead"
    assert _name_of(Outcome(claimed(2, 2, crashes=1), error="x")) == "failed", "crashes refund"
    assert _name_of(Outcome(job, snooze_us=5)) == "snoozed"
    assert _name_of(Outcome(job, error="cancelled: x", cancelled=True)) == "cancelled"


def test_middleware_nests_first_registered_outermost_and_refuses_a_second_call_next() -> None:
    order: list[str] = []
    ctx = JobContext(1, "k", "q", 1, 0, 1, datetime(2026, 1, 1, tzinfo=timezone.utc), "w")

    def named(name: str, twice: bool = False) -> Callable[..., Awaitable[None]]:
        async def mw(ctx: JobContext, call_next: Callable[[], Awaitable[None]]) -> None:
            order.append(f"{name} in")
            await call_next()
            if twice:
                await call_next()
            order.append(f"{name} out")

        return mw

    async def handler() -> None:
        order.append("handler")

    asyncio.run(run_middleware((named("a"), named("b")), ctx, handler))
    assert order == ["a in", "b in", "handler", "b out", "a out"]
    with pytest.raises(RuntimeError, match="called call_next twice"):
        asyncio.run(run_middleware((named("c", twice=True),), ctx, handler))
