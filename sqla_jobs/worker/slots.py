"""The slots that run handlers: up to ``concurrency`` tasks, each running buffered jobs one after
another; async handlers on the event loop, sync handlers on runner threads.

Timeouts. An async handler past its kind's timeout is cancelled and the run fails. A sync handler
cannot be interrupted (Python threads cannot be killed), so its job stays ``running``, its lease
renewed and its slot taken, until the thread really returns; only then does the run fail as timed
out. Its retry, and the next job of its concurrency key, can therefore never start while it still
runs. A sync handler still running ``stuck_grace`` seconds past its timeout is stuck: the worker
stops claiming and exits (code 5, ``EXIT_STUCK``) so that a supervisor restarts it, and the job, never given back,
is reaped once the process is gone.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from sqla_jobs._outcome import (
    Outcome,
    cancelled,
    completed,
    describe,
    encode_result,
    failed,
    resolve,
    snoozed,
)
from sqla_jobs.context import ClaimedJob, JobContext, Recorder, ResultsReader, Snooze
from sqla_jobs.errors import LeaseLostError
from sqla_jobs.hooks import run_middleware
from sqla_jobs.jobs import Jobs
from sqla_jobs.observe.runs import Observer
from sqla_jobs.worker.calls import HandlerCalls
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.prefetch import Prefetch
from sqla_jobs.worker.session_runs import SessionRuns
from sqla_jobs.worker.wakeups import Wakeups

log = logging.getLogger("sqla_jobs.worker")

#: A slot yields to the event loop at least once per this many jobs.
_YIELD_EVERY = 16
#: The message of a slot task's cancellation that an operator's cancel of its job caused (any
#: other is the shutdown's).
_CANCEL = "sqla-jobs: job cancelled by an operator"


class Slots:
    """Runs the buffered jobs of ``holdings`` on at most ``concurrency`` slot tasks."""

    def __init__(
        self,
        *,
        jobs: Jobs,
        worker: str,
        concurrency: int,
        holdings: Holdings,
        prefetch: Prefetch,
        wakeups: Wakeups,
        recorder: Recorder,
        lanes: int,
        stuck_grace: float,
        on_stuck: Callable[[ClaimedJob], None],
        sessions: SessionRuns | None = None,
        committed: Callable[[Outcome], None] | None = None,
        observer: Observer | None = None,
        reader: ResultsReader | None = None,
    ) -> None:
        self._jobs = jobs
        self._worker = worker
        self._concurrency = concurrency
        self._holdings = holdings
        self._prefetch = prefetch
        self._wakeups = wakeups
        self._recorder = recorder
        self._lanes = lanes
        self._committed = committed
        self._observer = observer
        self._reader = reader
        #: Whether a job's end gives the fetch loop something to do (set by the worker: the fetch
        #: loop is built after the slots).
        self.loop_has_work: Callable[[], bool] = lambda: True
        #: The slot tasks alive; also the only strong references to them (the loop keeps weak).
        self.tasks: set[asyncio.Task[None]] = set()
        self._turn = 0
        self._calls = HandlerCalls(holdings, concurrency, stuck_grace, on_stuck, sessions)
        #: Whether each handler is async (the calls' cache: the common case runs inline here).
        self._is_async = self._calls.is_async
        #: The kinds with a rate limit: the end of one of their jobs frees a slot to claim for.
        self._limited = frozenset(k.name for k in jobs if k.options.rate_limit is not None)

    def fill(self) -> None:
        """Give the buffered jobs to free slots. One task per slot rather than per job: creating
        and scheduling a task costs more than running a short job."""
        idle = min(self._concurrency - len(self.tasks), len(self._holdings.buffer))
        if self._wakeups.stopping or idle <= 0:
            return
        for _ in range(idle):
            self._turn += 1
            task = asyncio.create_task(self._slot(), name=f"sqla-jobs-slot-{self._turn}")
            self.tasks.add(task)

    def close(self) -> None:
        """Let the runner threads exit once their current call returns."""
        self._calls.close()

    async def _slot(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        holdings, wakeups = self._holdings, self._wakeups
        buffer, running = holdings.buffer, holdings.running
        ran = 0
        try:
            while buffer and not wakeups.stopping:
                job = buffer.popleft()
                if job.id in running:
                    holdings.defer(job)  # claimed again while its older run runs here
                    continue
                if job.crashes and holdings.give_back:
                    # The jobs the crash rule gives back are still locked by this worker until
                    # the fetch loop's release commits: should this job crash the process first,
                    # they would be charged its crash. It starts after the release (whoever
                    # took the claim has woken the loop for it; the loop fills the slots after).
                    buffer.appendleft(job)
                    return
                await self.run(job, task)  # sets holdings.buffered_at
                ran += 1
                # Handlers that never await would hold the loop for the whole buffer: yield when
                # the fetch loop has a round trip to start, and every few jobs (which also lets a
                # round trip's result in). Not after every job: each yield is a turn of the loop.
                if (
                    wakeups.event.is_set() and wakeups.in_flight < self._lanes
                ) or ran % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        finally:
            self.tasks.discard(task)

    async def run(self, job: ClaimedJob, task: asyncio.Task[Any] | None) -> None:
        """Run one job to its outcome (left in the holdings for the fetch loop to write)."""
        resolved = resolve(self._jobs, job)
        ready = resolved.__class__ is tuple
        timeout = resolved[0].options.timeout if ready else None  # type: ignore[index]
        ctx = JobContext.for_job(job, self._worker, self._recorder, timeout, self._reader)
        self._holdings.running[job.id] = (job, ctx, task)
        self._holdings.buffered_at = started = time.monotonic()
        observer = self._observer
        if observer is not None:
            observer.started(job, started)
        outcome: Outcome | None = None
        error: BaseException | None = None
        hooks = self._jobs.hooks
        is_async = self._is_async
        limited = self._limited
        try:
            if not ready:
                outcome = resolved  # type: ignore[assignment]
            else:
                kind, args = resolved  # type: ignore[misc]
                try:
                    if hooks.middlewares:
                        # Hook call site: the chain around the call; skipped (one test) without.
                        ctx._read_meta(job)
                        returned: list[Any] = []
                        call = functools.partial(
                            self._calls.call, kind, args, job, ctx, True, returned
                        )
                        await run_middleware(hooks.middlewares, ctx, call)
                        result = returned[0] if returned else None
                    elif timeout is None and not kind.wants_session and is_async.get(kind.handler):
                        # The common case inline, one coroutine frame fewer per job.
                        result = await kind.handler(args, ctx)  # type: ignore[misc]
                        if result is not None and inspect.isawaitable(result):
                            result = await result
                    else:
                        result = await self._calls.call(kind, args, job, ctx)
                    # A Session's handler stored its result in its own transaction.
                    if kind.options.results and not kind.wants_session:
                        stored = encode_result(job.id, job.kind, result)
                        outcome = completed(job, result=stored)
                    else:
                        outcome = completed(job, committed=kind.wants_session)
                    if self._holdings.cancelling and job.id in self._holdings.cancelling:
                        outcome.cancel_ignored = True
                        log.warning(
                            "job %s (%s) completed after a cancel request: its handler returned "
                            "without stopping (a sync handler must check ctx.cancelled)",
                            job.id,
                            job.kind,
                            extra={"event": "cancel_ignored", "job_id": job.id},
                        )
                except asyncio.CancelledError as exc:
                    if exc.args != (_CANCEL,):
                        raise  # at the shutdown timeout: no outcome; the job is given back
                    error = exc
                    outcome = cancelled(job, "the handler was cancelled")
                    uncancel = getattr(task, "uncancel", None)  # Python 3.11+
                    if uncancel is not None:
                        uncancel()
                except Snooze as exc:
                    error = exc
                    outcome = snoozed(job, exc)
                except LeaseLostError as exc:
                    error = exc
                    if kind.wants_session:
                        # Its transaction rolled back: the job belongs to its new owner.
                        log.warning("%s", exc, extra={"event": "lease_lost", "job_id": job.id})
                    else:
                        outcome = failed(job, kind, exc)
                except Exception as exc:
                    error = exc
                    if job.id in self._holdings.cancelling:
                        outcome = cancelled(job, f"the handler stopped: {describe(exc)}")
                    else:
                        outcome = failed(job, kind, exc, in_session=kind.wants_session)
        finally:
            now = time.monotonic()
            self._prefetch.observe(now - started)
            if outcome is not None:
                outcome.runtime = now - started
            if outcome is not None and outcome.committed:
                self._holdings.end(job, None, now)
                assert self._committed is not None
                self._committed(outcome)
            else:
                self._holdings.end(job, outcome, now)
            wakeups = self._wakeups
            if job.concurrency_key is not None or job.crashes or (limited and job.kind in limited):
                # Its key has room again, a slot a rate limited job may take (those are claimed
                # only for free slots), or the crash rule lets the jobs it made this worker give
                # back come again: look again without waiting for a poll.
                wakeups.undrain()
            # Set already (most jobs of a busy worker end so): no need to ask the fetch loop.
            if wakeups.stopping or (not wakeups.event.is_set() and self.loop_has_work()):
                wakeups.event.set()
            if outcome is not None and hooks.outcome_hooks:
                hooks._report(outcome, error)  # hook call site; never raises
            if outcome is not None and observer is not None:
                observer.ended(outcome, True)
            # The error's traceback holds this frame, which held the error: a cycle, keeping the
            # handler's frames and locals until the garbage collector's next walk.
            error = None

    def cancel(self, ids: Iterable[int]) -> None:
        """An operator asked to cancel the jobs ``ids``: each one this worker runs is told
        (``ctx.cancelled``), an async one's handler is cancelled at once; each one it holds but
        has not started ends ``cancelled`` without running."""
        holdings = self._holdings
        for job_id in ids:
            running = holdings.running.get(job_id)
            if running is None or job_id in holdings.cancelling:
                continue
            job, ctx, task = running
            holdings.cancelling.add(job_id)
            ctx.cancelled.set()
            kind = self._jobs.kind_named(job.kind)
            if task is not None and kind is not None and self._is_async.get(kind.handler):
                task.cancel(_CANCEL)
                how = "its async handler is cancelled now"
            else:
                how = (
                    "its sync handler is told through ctx.cancelled: the job ends cancelled if "
                    "the handler stops by raising, and completes if it returns"
                )
            log.info(
                "asked to cancel running job %s (%s): %s",
                job_id,
                job.kind,
                how,
                extra={"event": "cancel_requested", "job_id": job_id},
            )
        hooks = self._jobs.hooks
        for job in holdings.cancel_unstarted(ids):
            outcome = cancelled(job, "cancelled before it started")
            holdings.finish(outcome, time.monotonic())
            if hooks.outcome_hooks:
                hooks._report(outcome, None)  # hook call site; never raises
            if self._observer is not None:
                self._observer.ended(outcome, False)
        self._wakeups.event.set()

    def busy_threads(self) -> list[tuple[str, int | None]]:
        """The sync handler threads still running a handler, and their jobs."""
        return self._calls.busy_threads()
