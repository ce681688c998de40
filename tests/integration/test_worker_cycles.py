"""A job that ends by an exception leaves no reference cycle in the worker: its handler's frames,
and whatever their locals hold, are freed by reference counting once the run is over. A cycle
would keep them until the cyclic garbage collector's next walk, which ``sqla-jobs worker`` makes
rarer (sqla_jobs.worker.heap): a handler that fails while holding a large object would then hold
hundreds of them at once."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Discard, JobContext, Jobs, Snooze
from tests._waiting import wait_until
from tests.integration._workers import running_workers


class AsyncRaises(BaseModel):
    n: int = 0


class SyncRaises(AsyncRaises):
    pass


class Discards(AsyncRaises):
    pass


class TimesOut(AsyncRaises):
    pass


class Snoozes(AsyncRaises):
    pass


class SessionRaises(AsyncRaises):
    pass


class Held:
    """What a handler's local holds: freed with the handler's frame, or kept by a cycle."""


#: Weak references to each run's Held, by kind.
HELD: dict[str, list[weakref.ref[Held]]] = {}


def _hold(kind: str) -> Held:
    held = Held()
    HELD.setdefault(kind, []).append(weakref.ref(held))
    return held


def _kinds(middleware: bool) -> Jobs:
    jobs = Jobs()
    if middleware:

        @jobs.hooks.middleware
        async def through(ctx: JobContext, call_next: Callable[[], Awaitable[None]]) -> None:
            await call_next()

    @jobs.kind("async_raises", AsyncRaises, max_attempts=1)
    async def async_raises(args: AsyncRaises, ctx: JobContext) -> None:
        held = _hold("async_raises")
        raise ValueError(f"failed holding {held!r}")

    @jobs.kind("sync_raises", SyncRaises, max_attempts=1)
    def sync_raises(args: SyncRaises, ctx: JobContext) -> None:
        held = _hold("sync_raises")
        raise ValueError(f"failed holding {held!r}")

    @jobs.kind("discards", Discards)
    async def discards(args: Discards, ctx: JobContext) -> None:
        held = _hold("discards")
        raise Discard(f"discarded holding {held!r}")

    @jobs.kind("times_out", TimesOut, max_attempts=1, timeout=0.05)
    async def times_out(args: TimesOut, ctx: JobContext) -> None:
        held = _hold("times_out")
        await asyncio.sleep(60)
        del held

    @jobs.kind("snoozes", Snoozes)
    async def snoozes(args: Snoozes, ctx: JobContext) -> None:
        held = _hold("snoozes")
        if held is not None:
            raise Snooze(3600)

    @jobs.kind("session_raises", SessionRaises, max_attempts=1)
    def session_raises(args: SessionRaises, ctx: JobContext, session: Session) -> None:
        held = _hold("session_raises")
        session.execute(text("SELECT 1"))
        raise ValueError(f"failed holding {held!r}")

    return jobs


ENDED: dict[str, Callable[[dict[str, int]], int]] = {
    "async_raises": lambda c: c["dead"],
    "sync_raises": lambda c: c["dead"],
    "discards": lambda c: c["dead"],
    "times_out": lambda c: c["dead"],
    "snoozes": lambda c: c["snoozed"],
    "session_raises": lambda c: c["dead"],
}


@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "in-middleware"])
@pytest.mark.parametrize("kind", list(ENDED))
def test_a_run_that_raised_frees_its_handlers_frames_without_the_garbage_collector(
    clean: Engine, migrated_url: str, collector_off: None, kind: str, middleware: bool
) -> None:
    jobs = _kinds(middleware)
    HELD.pop(kind, None)
    with Session(clean) as session, session.begin():
        for i in range(3):
            jobs.enqueue(session, kind, {"n": i})
    with running_workers(jobs, migrated_url, poll_interval=0.2) as (worker,):
        wait_until(lambda: ENDED[kind](worker.counts) == 3, f"three {kind} runs ended")
    refs = HELD[kind]
    assert len(refs) == 3
    alive = [ref for ref in refs if ref() is not None]
    assert not alive, f"{len(alive)} of 3 runs' handler locals are kept by a reference cycle"
