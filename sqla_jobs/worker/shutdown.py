"""The graceful stop: give back what never started, let running handlers finish for a while, then
cancel them and give their jobs back as interrupted, and write every outcome still unwritten."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sqla_jobs.db.connections import CONNECTION_ERRORS
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.lanes import Lanes, some_ids

log = logging.getLogger("sqla_jobs.worker")

#: Tries at the final writes when the connection drops during the shutdown.
_TRIES = 3


async def shutdown(
    lanes: Lanes,
    holdings: Holdings,
    timeout: float,
    busy_threads: Callable[[], list[tuple[str, int | None]]] = list,
) -> None:
    """Stop a worker whose fetch loops have ended: unstarted jobs go back at once (for another
    worker), running handlers get ``timeout`` seconds, and those still running then are cancelled
    and given back (``interruptions`` counts them; neither budget is spent). A stuck sync
    handler's job is not given back: its thread may still act on it, so its lease runs out and
    it is reaped once the process is gone. What goes back, and the sync handler threads left
    running (``busy_threads``), are logged at WARNING by job id."""
    unstarted = holdings.unstarted()
    try:
        await lanes.release(unstarted, level=logging.WARNING)
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
    left = busy_threads()
    if left:
        log.warning(
            "left %d sync handler thread%s running at exit (Python cannot stop a thread): %s",
            len(left),
            "" if len(left) == 1 else "s",
            some_ids([f"{name} (job {job_id})" for name, job_id in left]),
            extra={"event": "abandoned"},
        )
    interrupted = [job for job, _, _ in running if job.id not in stuck]
    for attempt in range(_TRIES):
        try:
            await lanes.flush()
            await lanes.release(unstarted, level=logging.WARNING)
            unstarted = []
            await lanes.release(interrupted, interrupted=True, level=logging.WARNING)
            return
        except CONNECTION_ERRORS as exc:
            log.warning("shutdown write failed (%s), retrying", exc, extra={"event": "conn_lost"})
            await lanes.close()
            await asyncio.sleep(0.2 * (attempt + 1))
    log.error(
        "could not record outcomes at shutdown; their leases will expire and be reaped",
        extra={"event": "shutdown_incomplete"},
    )
