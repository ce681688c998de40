"""How a handler is called: an async one on the event loop (cancelled past its kind's timeout), a
sync one on a runner thread (waited for past it, see :mod:`~sqla_jobs.worker.overruns`), and one
that takes a Session inside the transaction that completes its job
(:mod:`~sqla_jobs.worker.session_runs`).

A run that raised must not leave its error behind in these frames: the error's traceback holds
every frame it passed through, so a local (or a future) holding the error makes a cycle that keeps
the handler's frames and their locals alive until the garbage collector's next walk.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable
from typing import Any

from sqla_jobs._outcome import HandlerTimeout
from sqla_jobs.context import ClaimedJob, JobContext
from sqla_jobs.kinds import Kind
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.overruns import Overruns
from sqla_jobs.worker.session_runs import SessionRuns
from sqla_jobs.worker.threads import SyncRunners


class HandlerCalls:
    """Calls the handlers of one worker's slots; its sync runner threads start on first use."""

    def __init__(
        self,
        holdings: Holdings,
        concurrency: int,
        stuck_grace: float,
        on_stuck: Callable[[ClaimedJob], None],
        sessions: SessionRuns | None,
    ) -> None:
        self._concurrency = concurrency
        self._sessions = sessions
        #: inspect.iscoroutinefunction per handler, computed once (it costs ~1.5 us per call).
        self.is_async: dict[Any, bool] = {}
        self._runners: SyncRunners | None = None
        self._overrun = Overruns(holdings, stuck_grace, on_stuck)

    async def call(
        self,
        kind: Kind,
        args: Any,
        job: ClaimedJob,
        ctx: JobContext,
        wrapped: bool = False,
        returned: list[Any] | None = None,
    ) -> Any:
        """Run the handler (``wrapped``: inside middleware, whose context variables a sync
        handler's thread then gets too); returns what it returned (also appended to
        ``returned``, for a call inside middleware, which drops return values)."""
        handler = kind.handler
        assert handler is not None
        is_async = self.is_async.get(handler)
        if is_async is None:
            is_async = self.is_async[handler] = inspect.iscoroutinefunction(handler)
        timeout = kind.options.timeout
        if kind.wants_session:
            await self._session_call(kind, args, job, ctx, is_async, wrapped)
            return None
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
            runners = self._sync_runners()
            if wrapped:
                future = runners.submit(
                    contextvars.copy_context().run, handler, args, ctx, job_id=job.id
                )
            else:
                future = runners.submit(handler, args, ctx, job_id=job.id)
            try:
                result = await self._overrun.result(future, timeout, job, ctx)
            finally:
                future.cancel()  # cancelled at shutdown: the runner drops the result
                del future  # it holds the handler's error, whose traceback holds this frame
        if result is not None and inspect.isawaitable(result):
            result = await result
        if returned is not None:
            returned.append(result)
        return result

    async def _session_call(
        self,
        kind: Kind,
        args: Any,
        job: ClaimedJob,
        ctx: JobContext,
        is_async: bool,
        wrapped: bool,
    ) -> None:
        """Run a handler that takes a Session, with its job's completion in its transaction."""
        sessions = self._sessions
        assert sessions is not None
        ctx.in_session = True  # ctx.step refuses: a step would outlive writes rolled back
        timeout = kind.options.timeout
        watch = sessions.watch(job)
        try:
            if is_async:
                call = sessions.async_call(kind, args, ctx, job)
                if timeout is None:
                    await call
                    return
                try:
                    await asyncio.wait_for(call, timeout)
                except asyncio.TimeoutError:
                    raise HandlerTimeout(f"timed out after {timeout:g}s") from None
                return
            run = sessions.sync_call(kind, args, ctx, job)
            runners = self._sync_runners()
            if wrapped:
                future = runners.submit(contextvars.copy_context().run, run, job_id=job.id)
            else:
                future = runners.submit(run, job_id=job.id)
            try:
                await self._overrun.result(future, timeout, job, ctx)
            except HandlerTimeout:
                # Returned past the timeout, but before its deadline check: it committed.
                if not (future.done() and not future.cancelled() and future.exception() is None):
                    raise
            finally:
                future.cancel()
                del future  # as in call: no cycle through the handler's error
        finally:
            watch.cancel()

    def busy_threads(self) -> list[tuple[str, int | None]]:
        """The sync handler threads still running a handler, and their jobs."""
        return [] if self._runners is None else self._runners.busy()

    def close(self) -> None:
        """Let the runner threads exit once their current call returns."""
        if self._runners is not None:
            self._runners.close()

    def _sync_runners(self) -> SyncRunners:
        if self._runners is None:
            self._runners = SyncRunners(
                asyncio.get_running_loop(), self._concurrency, "sqla-jobs-handler"
            )
        return self._runners
