"""Sync handlers past their timeout: Python threads cannot be killed, so the run is waited for
until the handler really returns, then fails as timed out; one still running ``stuck_grace``
seconds past its timeout is stuck, and the worker is told (it stops claiming and exits for a
restart, see :mod:`~sqla_jobs.worker.slots`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from sqla_jobs._outcome import HandlerTimeout
from sqla_jobs.context import ClaimedJob, JobContext
from sqla_jobs.worker.holdings import Holdings

log = logging.getLogger("sqla_jobs.worker")


class Overruns:
    """Waits for sync handlers' results under their kinds' timeouts."""

    def __init__(
        self, holdings: Holdings, stuck_grace: float, on_stuck: Callable[[ClaimedJob], None]
    ) -> None:
        self._holdings = holdings
        self._stuck_grace = stuck_grace
        self._on_stuck = on_stuck

    async def result(
        self, future: asyncio.Future[Any], timeout: float | None, job: ClaimedJob, ctx: JobContext
    ) -> Any:
        """The result of a sync handler's run (``future``), or :class:`HandlerTimeout` once it
        returned past ``timeout``; reports it stuck past the grace."""
        try:
            if timeout is None:
                return await future
            await asyncio.wait({future}, timeout=timeout)
            if future.done():
                return future.result()
            self._warn_overrun(timeout, job)
            await asyncio.wait({future}, timeout=self._stuck_grace)
            if not future.done():
                self._stuck(job)
                await asyncio.shield(future)  # until it returns, or the shutdown cancels this task
            error = future.exception()
            detail = f": {type(error).__name__}" if error is not None else ""
        finally:
            # The future holds the handler's error, and its traceback this frame: no cycle.
            del future
        took = time.monotonic() - (ctx.deadline or 0.0) + timeout
        raise HandlerTimeout(
            f"timed out after {timeout:g}s (the sync handler returned {took:.1f}s after it "
            f"started{detail})"
        )

    def _warn_overrun(self, timeout: float, job: ClaimedJob) -> None:
        log.warning(
            "job %s (%s) passed its timeout of %gs; its sync handler cannot be interrupted: the "
            "job stays running until the handler returns",
            job.id,
            job.kind,
            timeout,
            extra={"event": "timeout_overrun", "job_id": job.id, "kind": job.kind},
        )

    def _stuck(self, job: ClaimedJob) -> None:
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
