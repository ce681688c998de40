"""Step 6: a worker freezes mid-job; the reaper of another rescues the job, and fences it.

The frozen worker is a real one whose lease keeper is told to stop heartbeating (the
``heartbeats_paused`` seam), which is what a killed process, a long GC pause or a suspended VM
looks like from the database.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sqla_jobs.model import Job, JobHistory
from sqla_jobs.worker.config import WorkerSeams

from .invoices import DEADLINE, FROZEN_WORKER, NightlyExport
from .threads import DemoFailed, wait_for
from .tour import LEASE, Demo

RESCUER = "worker-C"


def rescue(demo: Demo) -> None:
    """Freeze worker-B in the middle of a job; worker-C reaps its lease and runs the job again,
    and worker-B's late completion is refused."""
    c = demo.console
    c.step(6, "A worker crash, rescued by the reaper")
    c.explain(
        f"{FROZEN_WORKER} (1 slot) claims a nightly_export job, then freezes: we set its lease "
        "keeper's `heartbeats_paused` test seam, so it stops heartbeating, exactly what a killed "
        "process, a long GC pause or a suspended VM looks like from the database. Its lease is "
        f"{LEASE:g}s. {RESCUER} starts with reap_interval=0.5 and rescues the job."
    )
    c.say()
    c.restart_clock()
    paused = threading.Event()
    paused.set()
    frozen = demo.worker(
        FROZEN_WORKER,
        concurrency=1,
        reap_interval=3600.0,
        seams=WorkerSeams(heartbeats_paused=paused),
    )
    c.event(f"{FROZEN_WORKER} started; its heartbeats are frozen")
    with Session(demo.app) as s, s.begin():
        job_id = demo.jobs.enqueue(s, NightlyExport(invoice_id=demo.invoice_id)).id
    lease_left = func.extract("epoch", Job.lease_expires_at - func.now())
    of_job = select(Job.state, Job.locked_by, Job.crashes, Job.attempts, lease_left).where(
        Job.id == job_id
    )

    def state() -> tuple[Any, ...]:
        rows = demo.rows(of_job)
        return tuple(rows[0]) if rows else ("gone", None, None, None, None)

    wait_for(f"{FROZEN_WORKER} to claim the export", lambda: state()[1] == FROZEN_WORKER)
    rescuer = demo.worker(RESCUER, concurrency=2, reap_interval=0.5)
    c.event(f"{RESCUER} started (reaps expired leases every 0.5 s)")
    shown = -1
    deadline = time.monotonic() + DEADLINE
    while (current := state())[0] == "running" and current[1] == FROZEN_WORKER:
        left = current[4]
        if left is not None and int(left) != shown and left > 0:
            shown = int(left)
            c.event(
                f"db: job {job_id} running on {FROZEN_WORKER}, no heartbeat, lease expires in "
                f"{float(left):.1f}s"
            )
        if time.monotonic() > deadline:
            raise DemoFailed("the frozen worker's lease was never reaped")
        time.sleep(0.05)
    wait_for(f"{RESCUER} to claim the rescued job", lambda: state()[1] == RESCUER)
    current = state()
    c.event(
        f"db: job {job_id} {current[0]} on {RESCUER}, attempts={current[3]}, crashes={current[2]}"
    )
    # Wake the frozen worker while the rescuer still runs the job: its completion must not
    # delete the row the rescuer now owns.
    frozen.worker.stop()
    demo.handlers.frozen_may_wake.set()
    demo.stop(frozen)
    current = state()
    c.event(
        f"db: {FROZEN_WORKER} stopped; job {job_id} is still {current[0]} on {current[1]}: "
        f"{FROZEN_WORKER}'s DELETE was fenced on its old lease token and matched nothing"
    )
    demo.handlers.rescue_may_finish.set()
    wait_for("the rescued job to finish", lambda: state()[0] == "gone")
    demo.stop(rescuer)
    done = demo.rows(select(JobHistory.attempts, JobHistory.crashes).where(JobHistory.id == job_id))
    if not done:
        raise DemoFailed(f"job {job_id} is missing from sqla_jobs_history")
    c.say()
    c.say(
        f"sqla_jobs_history: job {job_id} done once, by {RESCUER}, with attempts={done[0][0]} "
        f"and crashes={done[0][1]}"
    )
    c.explain(
        "Delivery is at-least-once: the export ran twice (the frozen run and the rescue), so "
        "handlers must be idempotent; ctx.attempt > 1 or ctx.crashes > 0 tells a handler it is "
        "a rerun. Crashes are counted apart from failures, so a drained node does not spend a "
        "job's failure budget (max_crashes bounds them)."
    )
