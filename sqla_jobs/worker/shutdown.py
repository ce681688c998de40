"""The graceful stop: give back what never started, let running handlers finish for a while, then
cancel them and give their jobs back as interrupted, and write every outcome still unwritten."""

from __future__ import annotations

import asyncio
import logging

from sqla_jobs.db.connections import CONNECTION_ERRORS
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.lanes import Lanes

log = logging.getLogger("sqla_jobs.worker")

#: Tries at the final writes when the connection drops during the shutdown.
_TRIES = 3


async def shutdown(lanes: Lanes, holdings: Holdings, timeout: float) -> None:
    """Stop a worker whose fetch loops have ended: unstarted jobs go back at once (for another
    worker), running handlers get ``timeout`` seconds, and those still running then are cancelled
    and given back (``interruptions`` counts them; neither budget is spent). A stuck sync
    handler's job is not given back: its thread may still act on it, so its lease runs out and
    it is reaped once the process is gone."""
    unstarted = holdings.unstarted()
    try:
        await lanes.release(unstarted)
        unstarted = []
    except CONNECTION_ERRORS:
        pass  # retried below with the rest
    tasks = {task for _, _, task in holdings.running.values() if task is not None}
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    running = list(holdings.running.values())
    stuck = set(holdings.stuck)  # taken before their runs end (and leave the holdings)
    cancelled = [task for _, _, task in running if task is not None]
    for task in cancelled:
        task.cancel()
    await asyncio.gather(*cancelled, return_exceptions=True)
    interrupted = [job for job, _, _ in running if job.id not in stuck]
    for attempt in range(_TRIES):
        try:
            await lanes.flush()
            await lanes.release(unstarted)
            unstarted = []
            await lanes.release(interrupted, interrupted=True)
            return
        except CONNECTION_ERRORS as exc:
            log.warning("shutdown write failed (%s), retrying", exc, extra={"event": "conn_lost"})
            await lanes.close()
            await asyncio.sleep(0.2 * (attempt + 1))
    log.error(
        "could not record outcomes at shutdown; their leases will expire and be reaped",
        extra={"event": "shutdown_incomplete"},
    )
