"""The hooks (``jobs.hooks``) against a real PostgreSQL and in-process workers: on_enqueue on every
enqueue path, middleware around sync and async handlers, on_outcome for every outcome."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import (
    ConfigurationError,
    Discard,
    EnqueueBatch,
    EnqueueHookError,
    InvalidMetaError,
    JobContext,
    Jobs,
    OutcomeEvent,
    Snooze,
    Worker,
)
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.enqueue.insert import CHUNK, COPY_THRESHOLD
from tests._waiting import wait_until

from .test_worker import DEADLINE, enqueue, job_row, make_due, running


class Ping(BaseModel):
    n: int = 0


#: enqueue_many's paths: one INSERT, a COPY of one chunk, a COPY validated while it streams.
SIZES = (3, COPY_THRESHOLD, CHUNK + 1)


def stored_metas(engine: Engine, ids: list[int]) -> list[Any]:
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT id, meta FROM sqla_jobs_job WHERE id = ANY(:ids)"), {"ids": ids}
            ).all()
        )
    return [rows[i] for i in ids]


# -- on_enqueue ----------------------------------------------------------------------------------


def tracing_jobs() -> tuple[Jobs, list[tuple[int, list[str], list[str]]]]:
    """Jobs whose on_enqueue hook records each batch and stamps a trace id on every job."""
    jobs = Jobs()
    jobs.register("ping", Ping, queue="q1")
    seen: list[tuple[int, list[str], list[str]]] = []

    @jobs.hooks.on_enqueue
    def trace(batch: EnqueueBatch) -> None:
        seen.append((len(batch), sorted(set(batch.kinds)), sorted(set(batch.queues))))
        batch.add_meta({"trace": "t-1"})

    return jobs, seen


def test_on_enqueue_adds_meta_on_every_sync_path_once_per_chunk(clean: Engine) -> None:
    jobs, seen = tracing_jobs()
    with Session(clean) as session:
        ids = [jobs.enqueue(session, Ping(), meta={"tenant": "a"}).id]
        for size in SIZES:
            ids += jobs.enqueue_many(session, [Ping(n=i) for i in range(size)])
        session.commit()
    assert stored_metas(clean, ids) == [{"tenant": "a", "trace": "t-1"}] + [{"trace": "t-1"}] * sum(
        SIZES
    )
    # One call per enqueue, and per chunk of enqueue_many: the last size is two chunks.
    assert [n for n, _, _ in seen] == [1, 3, COPY_THRESHOLD, CHUNK, 1]
    assert {(tuple(k), tuple(q)) for _, k, q in seen} == {(("ping",), ("q1",))}


def test_on_enqueue_adds_meta_on_every_async_path(clean: Engine, migrated_url: str) -> None:
    jobs, seen = tracing_jobs()

    async def main() -> list[int]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                ids = [(await jobs.enqueue_async(session, Ping())).id]
                for size in SIZES:
                    payloads = [Ping(n=i) for i in range(size)]
                    ids += await jobs.enqueue_many_async(session, payloads, meta={"s": size})
                await session.commit()
                return ids
        finally:
            await engine.dispose()

    ids = asyncio.run(main())
    expected = [{"trace": "t-1"}] + [
        {"s": size, "trace": "t-1"} for size in SIZES for _ in range(size)
    ]
    assert stored_metas(clean, ids) == expected
    assert len(seen) == 1 + len(SIZES) + 1


def test_on_enqueue_changes_one_jobs_meta_through_metas_on_the_copy_path(clean: Engine) -> None:
    jobs = Jobs()
    jobs.register("ping", Ping)

    @jobs.hooks.on_enqueue
    def number(batch: EnqueueBatch) -> None:
        for i, meta in enumerate(batch.metas):
            if i % 2:
                meta["odd"] = True

    @jobs.hooks.on_enqueue
    def stamp(batch: EnqueueBatch) -> None:
        batch.add_meta({"by": "stamp"})  # after metas was built: applied to each job's dict

    given: list[dict[str, Any] | None] = [{"i": i} if i % 3 else None for i in range(100)]
    with Session(clean) as session:
        ids = jobs.enqueue_many(session, [Ping(n=i) for i in range(100)], meta=given)
        session.commit()
    expected = [
        {**(g or {}), **({"odd": True} if i % 2 else {}), "by": "stamp"}
        for i, g in enumerate(given)
    ]
    assert stored_metas(clean, ids) == expected


def test_a_raising_on_enqueue_hook_writes_nothing_and_leaves_the_transaction_usable(
    clean: Engine,
) -> None:
    jobs = Jobs()
    jobs.register("ping", Ping)
    calls = 0

    @jobs.hooks.on_enqueue
    def second_chunk_fails(batch: EnqueueBatch) -> None:
        nonlocal calls
        calls += 1
        if calls % 2 == 0:
            raise LookupError("no tracer")

    with Session(clean) as session:
        kept = jobs.enqueue(session, Ping()).id  # call 1
        with pytest.raises(EnqueueHookError, match="raised LookupError: no tracer") as caught:
            jobs.enqueue(session, Ping())  # call 2
        assert isinstance(caught.value.__cause__, LookupError)
        calls = 0
        # The streamed COPY's second chunk fails while the first is stored: rolled back.
        with pytest.raises(EnqueueHookError):
            jobs.enqueue_many(session, [Ping(n=i) for i in range(CHUNK + 1)])
        assert session.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 1
        session.commit()
    with clean.connect() as conn:
        assert list(conn.scalars(text("SELECT id FROM sqla_jobs_job"))) == [kept]


def test_meta_an_on_enqueue_hook_adds_is_checked_like_meta_given(clean: Engine) -> None:
    jobs = Jobs()
    jobs.register("ping", Ping)
    jobs.hooks.on_enqueue(lambda batch: batch.add_meta({"bad": float("inf")}))
    with Session(clean) as session:
        with pytest.raises(InvalidMetaError, match="meta after on_enqueue is not JSON"):
            jobs.enqueue_many(session, [Ping()] * COPY_THRESHOLD)
        assert session.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 0


def test_hooks_of_the_wrong_shape_are_refused_at_registration() -> None:
    jobs = Jobs()

    async def async_hook(event: Any) -> None:
        pass

    def sync_middleware(ctx: JobContext, call_next: Any) -> None:
        pass

    with pytest.raises(ConfigurationError, match="must be a plain function"):
        jobs.hooks.on_enqueue(async_hook)
    with pytest.raises(ConfigurationError, match="must be a plain function"):
        jobs.hooks.on_outcome(async_hook)
    with pytest.raises(ConfigurationError, match="must be an async function"):
        jobs.hooks.middleware(sync_middleware)


# -- middleware and on_outcome ----------------------------------------------------------------------

SPAN: contextvars.ContextVar[str] = contextvars.ContextVar("span", default="none")


class Run(BaseModel):
    do: str = "return"


class AsyncRun(BaseModel):
    do: str = "return"


def behave(do: str, ctx: JobContext) -> None:
    if do == "raise":
        raise ValueError("boom")
    if do == "snooze":
        raise Snooze(3600)
    if do == "discard":
        raise Discard("gone")


class Recorder:
    """Hooks that record what they saw, and a job app with a sync and an async kind."""

    def __init__(self) -> None:
        self.jobs = Jobs()
        self.lock = threading.Lock()
        self.events: list[OutcomeEvent] = []
        self.around: list[tuple[str, str, int, str]] = []
        self.in_handler: dict[int, str] = {}
        jobs = self.jobs

        @jobs.kind("sync_run", Run, max_attempts=2)
        def sync_run(args: Run, ctx: JobContext) -> None:
            self.in_handler[ctx.job_id] = f"{SPAN.get()} on {threading.current_thread().name}"
            behave(args.do, ctx)

        @jobs.kind("async_run", AsyncRun, max_attempts=2)
        async def async_run(args: AsyncRun, ctx: JobContext) -> None:
            self.in_handler[ctx.job_id] = f"{SPAN.get()} on {threading.current_thread().name}"
            await asyncio.sleep(0)
            behave(args.do, ctx)

        @jobs.hooks.middleware
        async def outer(ctx: JobContext, call_next: Callable[[], Awaitable[None]]) -> None:
            token = SPAN.set(f"span-{ctx.job_id}")
            try:
                await call_next()
            except BaseException as exc:
                self.note("outer", type(exc).__name__, ctx)
                raise
            finally:
                SPAN.reset(token)
            self.note("outer", "returned", ctx)

        @jobs.hooks.middleware
        async def inner(ctx: JobContext, call_next: Callable[[], Awaitable[None]]) -> None:
            self.note("inner", "before", ctx)
            await call_next()

        jobs.hooks.on_outcome(self.events.append)

    def note(self, where: str, what: str, ctx: JobContext) -> None:
        with self.lock:
            self.around.append((where, what, ctx.job_id, ctx.kind))

    def event(self, job_id: int) -> OutcomeEvent:
        (found,) = [e for e in self.events if e.job_id == job_id]
        return found


@pytest.mark.parametrize("kind", ["sync_run", "async_run"])
def test_middleware_and_on_outcome_see_each_outcome_of_sync_and_async_handlers(
    clean: Engine, migrated_url: str, kind: str
) -> None:
    """Middleware wraps the handler (its context variables reach a sync handler's thread),
    sees the handler's exceptions pass through unchanged, and on_outcome hears completed,
    failed, dead and snoozed with the exception."""
    rec = Recorder()
    does = ["return", "raise", "snooze", "discard"]
    with Session(clean) as session:
        ids = [rec.jobs.enqueue(session, kind, {"do": do}).id for do in does]
        session.commit()
    worker = Worker(rec.jobs, migrated_url, poll_interval=0.1)
    with running(worker):
        wait_until(lambda: len(rec.events) == 4, "four outcomes told")
        make_due(clean, ids[1])  # the failure's retry: its last attempt, which fails too
        wait_until(lambda: len(rec.events) == 5, "the retry's outcome told")
    done, failed, snoozed, discarded = ids
    outcomes = [(e.job_id, e.outcome, e.attempt) for e in rec.events]
    assert sorted(outcomes) == sorted(
        [
            (done, "completed", 1),
            (failed, "failed", 1),
            (snoozed, "snoozed", 1),
            (discarded, "dead", 1),
            (failed, "dead", 2),
        ]
    )
    assert rec.event(done).exception is None
    assert isinstance(rec.event(snoozed).exception, Snooze)
    assert isinstance(rec.event(discarded).exception, Discard)
    failures = [e for e in rec.events if e.job_id == failed]
    assert all(isinstance(e.exception, ValueError) for e in failures)
    assert all(e.kind == kind and e.queue == "default" and e.duration >= 0 for e in rec.events)
    # The database agrees with the worker's outcome rules: the middleware changed nothing.
    assert job_row(clean, done) is None
    assert [job_row(clean, i).state for i in (failed, snoozed, discarded)] == [  # type: ignore[union-attr]
        "dead",
        "pending",
        "dead",
    ]
    seen_outer = sorted((what, job_id) for where, what, job_id, _ in rec.around if where == "outer")
    assert seen_outer == sorted(
        [
            ("returned", done),
            ("ValueError", failed),
            ("ValueError", failed),
            ("Snooze", snoozed),
            ("Discard", discarded),
        ]
    )
    assert sum(1 for where, *_ in rec.around if where == "inner") == 5
    expected_thread = "sqla-jobs-handler" if kind == "sync_run" else "test-"
    for job_id in ids:
        assert rec.in_handler[job_id].startswith(f"span-{job_id} on {expected_thread}")


def test_a_cancelled_async_run_passes_through_middleware_and_is_told_cancelled(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    started = threading.Event()
    seen: list[str] = []
    events: list[OutcomeEvent] = []

    @jobs.kind("slow", Run)
    async def slow(args: Run, ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    @jobs.hooks.middleware
    async def watch(ctx: JobContext, call_next: Callable[[], Awaitable[None]]) -> None:
        try:
            await call_next()
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise

    jobs.hooks.on_outcome(events.append)
    with running(Worker(jobs, migrated_url, poll_interval=30, lease=60)):
        (job_id,) = enqueue(clean, jobs, [Run()])
        assert started.wait(DEADLINE)
        with Session(clean) as session, session.begin():
            jobs.cancel(session, [job_id])
        wait_until(lambda: len(events) == 1, "the cancel is told")
    assert seen == ["CancelledError"]
    assert (events[0].outcome, events[0].job_id) == ("cancelled", job_id)
    wait_until(
        lambda: job_row(clean, job_id).state == "cancelled",  # type: ignore[union-attr]
        "the job ends cancelled",
    )


def test_a_raising_on_outcome_hook_is_logged_and_the_worker_keeps_running_jobs(
    clean: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = Jobs()
    jobs.register("ping", Ping, lambda args, ctx: None)
    told: list[int] = []

    @jobs.hooks.on_outcome
    def broken(event: OutcomeEvent) -> None:
        raise RuntimeError("metrics backend down")

    jobs.hooks.on_outcome(lambda event: told.append(event.job_id))
    caplog.set_level(logging.ERROR, logger="sqla_jobs.hooks")
    worker = Worker(jobs, migrated_url, poll_interval=0.1)
    with running(worker):
        ids = enqueue(clean, jobs, [Ping(n=i) for i in range(5)])
        wait_until(lambda: all(job_row(clean, i) is None for i in ids), "every job completes")
    assert sorted(told) == ids, "the next hook still ran"
    failures = [r for r in caplog.records if getattr(r, "event", None) == "hook_failed"]
    assert len(failures) == 5
    assert failures[0].exc_info is not None
    assert "metrics backend down" in caplog.text
