"""The event loop's side of a worker, built and wired: lanes, slots, the listener hand-off and
the fetch loop, sharing one :class:`~sqla_jobs.worker.holdings.Holdings` and one
:class:`~sqla_jobs.worker.wakeups.Wakeups`. (The threads are :mod:`sqla_jobs.worker.services`.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqla_jobs.context import ClaimedJob
from sqla_jobs.db.connections import Connector
from sqla_jobs.jobs import Jobs
from sqla_jobs.observe.runs import Observer
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.fetch import FetchLoop
from sqla_jobs.worker.handoff import Handoff
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.lanes import Lanes
from sqla_jobs.worker.orphans import Orphans
from sqla_jobs.worker.prefetch import Prefetch
from sqla_jobs.worker.rated import RatedClaim, RatedKinds
from sqla_jobs.worker.session_runs import SessionRuns
from sqla_jobs.worker.slots import Slots
from sqla_jobs.worker.steps import StepWriter
from sqla_jobs.worker.wakeups import Wakeups


@dataclass(frozen=True)
class Parts:
    """What a running worker is made of, on its event loop."""

    steps: StepWriter
    lanes: Lanes
    slots: Slots
    handoff: Handoff | None
    fetch: FetchLoop


def build_parts(
    *,
    jobs: Jobs,
    config: WorkerConfig,
    connector: Connector,
    sql: WorkerSQL,
    holdings: Holdings,
    prefetch: Prefetch,
    wakeups: Wakeups,
    counts: dict[str, int],
    keyed: bool,
    on_stuck: Callable[[ClaimedJob], None],
    sessions: SessionRuns | None = None,
    observer: Observer | None = None,
) -> Parts:
    """The parts, wired to one another (the hand-off only with ``config.listen``)."""
    steps = StepWriter(connector, sql.record_step, sql.parent_results)
    rated_claim = None
    # Only a worker that runs rate limited kinds runs the rate limited claim.
    rated = RatedKinds.of(jobs)
    if rated is not None:
        rated_claim = RatedClaim(sql=sql, rated=rated, holdings=holdings, wakeups=wakeups)
    lanes = Lanes(
        connector=connector,
        sql=sql,
        config=config,
        holdings=holdings,
        wakeups=wakeups,
        counts=counts,
        keyed=keyed,
        rated=rated_claim,
    )
    slots = Slots(
        jobs=jobs,
        worker=connector.worker,
        concurrency=config.concurrency,
        holdings=holdings,
        prefetch=prefetch,
        wakeups=wakeups,
        recorder=steps,
        reader=steps.parent_results,
        lanes=len(lanes.lanes),
        stuck_grace=config.stuck_grace,
        on_stuck=on_stuck,
        sessions=sessions,
        committed=lanes.committed,
        observer=observer,
    )
    handoff = None
    if config.listen:
        handoff = Handoff(
            sql=sql,
            worker=connector.worker,
            lease=timedelta(seconds=config.lease),
            holdings=holdings,
            prefetch=prefetch,
            wakeups=wakeups,
            counts=counts,
            # The loop has its own claims to make after the thread's: keyed or rate limited.
            keyed=keyed or rated is not None,
            fill=slots.fill,
        )
    fetch = FetchLoop(
        config=config,
        holdings=holdings,
        lanes=lanes,
        slots=slots,
        prefetch=prefetch,
        wakeups=wakeups,
        handoff=handoff,
        orphans=Orphans(
            sql=sql, worker=connector.worker, holdings=holdings, wakeups=wakeups, counts=counts
        ),
    )
    slots.loop_has_work = fetch.has_work
    return Parts(steps=steps, lanes=lanes, slots=slots, handoff=handoff, fetch=fetch)
