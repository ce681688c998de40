"""Durable steps: a retried job does not redo the steps it already finished."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Backoff, JobContext, Jobs, LeaseLostError, StepError, testing

from ._workers import queue_empty, running_workers, wait_until

FAST_RETRY = Backoff(base=1, cap_seconds=0)


class Order(BaseModel):
    order_id: int


def test_retry_after_a_failure_skips_finished_steps_and_runs_the_rest(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    calls: Counter[str] = Counter()
    seen: list[tuple[int, object, object]] = []

    @jobs.kind("order", Order, backoff=FAST_RETRY)
    def order(args: Order, ctx: JobContext) -> None:
        charge = ctx.step(
            "charge", lambda: calls.update(["charge"]) or {"id": f"ch_{args.order_id}"}
        )
        mail = ctx.step("mail", lambda: calls.update(["mail"]) or ["sent", 1])
        if ctx.attempt == 1:
            raise RuntimeError("crash after step two")
        ctx.step("ship", lambda: calls.update(["ship"]) or 3)
        seen.append((ctx.attempt, charge, mail))

    with Session(clean) as s, s.begin():
        jobs.enqueue(s, Order(order_id=9))
    with running_workers(jobs, migrated_url, poll_interval=0.1):
        wait_until(queue_empty(clean), 20, "the job to complete")
    assert calls == Counter({"charge": 1, "mail": 1, "ship": 1})
    # The retry got the recorded results (JSON form), not fresh ones.
    assert seen == [(2, {"id": "ch_9"}, ["sent", 1])]


def test_async_handlers_record_steps_with_astep(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()
    calls: Counter[str] = Counter()

    async def fetch() -> int:
        await asyncio.sleep(0)
        calls["fetch"] += 1
        return 41

    @jobs.kind("order", Order, backoff=FAST_RETRY)
    async def order(args: Order, ctx: JobContext) -> None:
        value = await ctx.astep("fetch", fetch)
        await ctx.astep("store", lambda v: calls.update(["store"]) or v + 1, value)
        if ctx.attempt < 3:
            raise RuntimeError("again")

    with Session(clean) as s, s.begin():
        jobs.enqueue(s, Order(order_id=1))
    with running_workers(jobs, migrated_url, poll_interval=0.1):
        wait_until(queue_empty(clean), 20, "the job to complete")
    assert calls == Counter({"fetch": 1, "store": 1})


def test_a_step_cannot_be_recorded_once_the_lease_is_lost(clean: Engine) -> None:
    jobs = Jobs()
    outcome: list[BaseException] = []
    sessions: list[Session] = []

    @jobs.kind("order", Order)
    def order(args: Order, ctx: JobContext) -> None:
        ctx.step("one", lambda: 1)
        # Another worker takes the job over: the lease token changes under us. (Written in the
        # test's own transaction, which holds the row since run_jobs claimed it there.)
        sessions[0].execute(text("UPDATE sqla_jobs_job SET lease_token = gen_random_uuid()"))
        try:
            ctx.step("two", lambda: 2)
        except LeaseLostError as exc:
            outcome.append(exc)
            raise

    with Session(clean) as s, s.begin():
        jobs.enqueue(s, Order(order_id=1))
    with Session(clean) as s, s.begin():
        sessions.append(s)
        # all_jobs: the job was committed by another transaction, not written by this one.
        result = testing.run_jobs(jobs, s, raise_errors=False, all_jobs=True)
    assert result.done == 0
    assert len(outcome) == 1
    with clean.connect() as conn:
        steps = conn.execute(text("SELECT steps FROM sqla_jobs_job")).scalar_one()
    assert steps == {"one": 1}


def test_step_results_must_be_json_and_names_non_empty(clean: Engine) -> None:
    jobs = Jobs()
    errors: list[BaseException] = []

    @jobs.kind("order", Order)
    def order(args: Order, ctx: JobContext) -> None:
        for name, fn in (("bad", lambda: object()), ("", lambda: 1)):
            with pytest.raises(StepError):
                ctx.step(name, fn)
            errors.append(StepError(name))

    with Session(clean) as s, s.begin():
        jobs.enqueue(s, Order(order_id=1))
        assert testing.run_jobs(jobs, s).done == 1
    assert len(errors) == 2
