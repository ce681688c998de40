"""The slots that run handlers: up to ``concurrency`` tasks, each running buffered jobs one after
another; async handlers on the event loop, sync handlers on runner threads.

Timeouts. An async handler past its kind's timeout is cancelled and the run fails. A sync handler
cannot be interrupted (Python threads cannot be killed), so its job stays ``running``, its lease
renewed and its slot taken, until the thread really returns; only then does the run fail as timed
out. Its retry, and the next job of its concurrency key, can therefore never start while it still
runs. A sync handler still running ``stuck_grace`` seconds past its timeout is stuck: the worker
stops claiming and exits (code 3) so that a supervisor restarts it, and the job, never given back,
is reaped once the process is gone.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from ._holdings import Holdings
from ._outcome import HandlerTimeout, Outcome, cancelled, describe, failed, resolve, snoozed
from ._prefetch import Prefetch
from ._threads import SyncRunners
from ._wakeups import Wakeups
from .context import ClaimedJob, JobContext, Recorder, Snooze
from .hooks import run_middleware
from .jobs import Jobs
from .kinds import Kind

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
    ) -> None:
        self._jobs = jobs
        self._worker = worker
        self._concurrency = concurrency
        self._holdings = holdings
        self._prefetch = prefetch
        self._wakeups = wakeups
        self._recorder = recorder
        self._lanes = lanes
        self._stuck_grace = stuck_grace
        self._on_stuck = on_stuck
        #: Whether a job's end gives the fetch loop something to do (set by the worker: the fetch
        #: loop is built after the slots).
        self.loop_has_work: Callable[[], bool] = lambda: True
        #: The slot tasks alive; also the only strong references to them (the loop keeps weak).
        self.tasks: set[asyncio.Task[None]] = set()
        self._turn = 0
        #: inspect.iscoroutinefunction per handler, computed once (it costs ~1.5 us per call).
        self._is_async: dict[Any, bool] = {}
        self._runners: SyncRunners | None = None

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
        if self._runners is not None:
            self._runners.close()

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
                holdings.buffered_at = time.monotonic()
                await self.run(job, task)
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
        ctx = JobContext.for_job(job, self._worker, self._recorder, timeout)
        self._holdings.running[job.id] = (job, ctx, task)
        started = time.monotonic()
        outcome: Outcome | None = None
        error: BaseException | None = None
        hooks = self._jobs.hooks
        try:
            if not ready:
                outcome = resolved  # type: ignore[assignment]
            else:
                kind, args = resolved  # type: ignore[misc]
                try:
                    if hooks.middlewares:
                        # Hook call site: the chain around the call; skipped (one test) without.
                        call = functools.partial(self._call, kind, args, job, ctx, True)
                        await run_middleware(hooks.middlewares, ctx, call)
                    else:
                        await self._call(kind, args, job, ctx)
                    outcome = Outcome(job)
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
                except Exception as exc:
                    error = exc
                    if job.id in self._holdings.cancelling:
                        outcome = cancelled(job, f"the handler stopped: {describe(exc)}")
                    else:
                        outcome = failed(job, kind, exc)
        finally:
            now = time.monotonic()
            self._prefetch.observe(now - started)
            if outcome is not None:
                outcome.runtime = now - started
            self._holdings.end(job, outcome, now)
            wakeups = self._wakeups
            if job.concurrency_key is not None:
                # Its key has room again: look for the key's next job without waiting for a poll.
                wakeups.undrain()
            if wakeups.stopping or self.loop_has_work():
                wakeups.event.set()
            if outcome is not None and hooks.outcome_hooks:
                hooks._report(outcome, error)  # hook call site; never raises

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
        hooks = self._jobs.hooks
        for job in holdings.cancel_unstarted(ids):
            outcome = cancelled(job, "cancelled before it started")
            holdings.finish(outcome, time.monotonic())
            if hooks.outcome_hooks:
                hooks._report(outcome, None)  # hook call site; never raises
        self._wakeups.event.set()

    async def _call(
        self, kind: Kind, args: Any, job: ClaimedJob, ctx: JobContext, wrapped: bool = False
    ) -> None:
        """Run the handler (``wrapped``: inside middleware, whose context variables a sync
        handler's thread then gets too)."""
        handler = kind.handler
        assert handler is not None
        is_async = self._is_async.get(handler)
        if is_async is None:
            is_async = self._is_async[handler] = inspect.iscoroutinefunction(handler)
        timeout = kind.options.timeout
        if is_async:
            call: Any = handler(args, ctx)
            if timeout is None:
                result = await call
            else:
                try:
                    result = await asyncio.wait_for(call, timeout)
                except asyncio.TimeoutError:  # not the built-in TimeoutError before 3.11
                    raise HandlerTimeout(f"timed out after {timeout:g}s") from None
        else:
            if self._runners is None:
                self._runners = SyncRunners(
                    asyncio.get_running_loop(), self._concurrency, "sqla-jobs-handler"
                )
            if wrapped:
                future = self._runners.submit(contextvars.copy_context().run, handler, args, ctx)
            else:
                future = self._runners.submit(handler, args, ctx)
            try:
                result = await self._sync_result(future, timeout, job, ctx)
            finally:
                future.cancel()  # cancelled at shutdown: the runner drops the result
        if result is not None and inspect.isawaitable(result):
            await result

    async def _sync_result(
        self, future: asyncio.Future[Any], timeout: float | None, job: ClaimedJob, ctx: JobContext
    ) -> Any:
        if timeout is None:
            return await future
        done, _ = await asyncio.wait({future}, timeout=timeout)
        if done:
            return future.result()
        log.warning(
            "job %s (%s) passed its timeout of %gs; its sync handler cannot be interrupted: the "
            "job stays running until the handler returns",
            job.id,
            job.kind,
            timeout,
            extra={"event": "timeout_overrun", "job_id": job.id, "kind": job.kind},
        )
        done, _ = await asyncio.wait({future}, timeout=self._stuck_grace)
        if not done:
            self._holdings.stuck.add(job.id)
            log.error(
                "job %s (%s): its sync handler is still running %gs past its timeout and cannot "
                "be stopped; the worker stops claiming and exits for a restart. The job is not "
                "given back: it is reaped once this process is gone",
                job.id,
                job.kind,
                self._stuck_grace,
                extra={"event": "stuck", "job_id": job.id, "kind": job.kind},
            )
            self._on_stuck(job)
            await asyncio.shield(future)  # until it returns, or the shutdown cancels this task
        took = time.monotonic() - (ctx.deadline or 0.0) + timeout
        error = future.exception()
        detail = f": {type(error).__name__}" if error is not None else ""
        raise HandlerTimeout(
            f"timed out after {timeout:g}s (the sync handler returned {took:.1f}s after it "
            f"started{detail})"
        )
