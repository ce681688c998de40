"""The event loop's side of a worker, built and wired: lanes, slots, the listener hand-off and
the fetch loop, sharing one :class:`~sqla_jobs._holdings.Holdings` and one
:class:`~sqla_jobs._wakeups.Wakeups`. (The threads are :mod:`sqla_jobs._services`.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from ._config import WorkerConfig
from ._connections import Connector
from ._fetch import FetchLoop
from ._handoff import Handoff
from ._holdings import Holdings
from ._lanes import Lanes
from ._observe import Observer
from ._prefetch import Prefetch
from ._session_runs import SessionRuns
from ._slots import Slots
from ._sql import WorkerSQL
from ._steps import StepWriter
from ._wakeups import Wakeups
from .context import ClaimedJob
from .jobs import Jobs


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
    steps = StepWriter(connector, sql.record_step)
    lanes = Lanes(
        connector=connector,
        sql=sql,
        config=config,
        holdings=holdings,
        wakeups=wakeups,
        counts=counts,
        keyed=keyed,
    )
    slots = Slots(
        jobs=jobs,
        worker=connector.worker,
        concurrency=config.concurrency,
        holdings=holdings,
        prefetch=prefetch,
        wakeups=wakeups,
        recorder=steps,
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
            keyed=keyed,
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
    )
    slots.loop_has_work = fetch.has_work
    return Parts(steps=steps, lanes=lanes, slots=slots, handoff=handoff, fetch=fetch)
