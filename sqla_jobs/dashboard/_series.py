"""The last hour of ``sqla_jobs_stats`` (``sqla_jobs.throughput.recent``) as the throughput page
shows it: per minute, runs ended by outcome and the mean pickup delay and run time (sums divided
by counts, so minutes and kinds add up exactly); per queue and kind, the hour's totals.
Pure: the minutes and the database's clock come in, nothing is read here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqla_jobs.observe.throughput import Minute

#: The outcomes a worker counts, in the order the chart stacks them (the common one at the
#: bottom, the alarming ones on top where they show).
OUTCOMES = ("completed", "snoozed", "cancelled", "failed", "crashed", "dead")
#: Minutes the page covers.
SPAN = 60


@dataclass
class Total:
    """One queue and kind over the hour: runs by outcome, and the sums the means come from."""

    queue: str
    kind: str
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    runs: int = 0
    run_seconds: float = 0.0
    pickups: int = 0
    pickup_seconds: float = 0.0

    @property
    def mean_run(self) -> float | None:
        return self.run_seconds / self.runs if self.runs else None

    @property
    def mean_pickup(self) -> float | None:
        return self.pickup_seconds / self.pickups if self.pickups else None

    def add(self, minute: Minute) -> None:
        for outcome in OUTCOMES:
            self.outcomes[outcome] += int(getattr(minute, outcome))
        self.runs += int(minute.runs)
        self.run_seconds += float(minute.run_seconds)
        self.pickups += int(minute.pickups)
        self.pickup_seconds += float(minute.pickup_seconds)


@dataclass(frozen=True)
class Hour:
    """The chart's series, slot by slot (the oldest minute first), and the table's totals."""

    slots: list[datetime]
    outcomes: dict[str, list[int]]
    mean_pickup: list[float | None]
    mean_run: list[float | None]
    totals: list[Total]
    #: Every queue seen in the hour, for the filter (whatever the filter is).
    queues: list[str]

    @property
    def empty(self) -> bool:
        return not self.totals


def hour(minutes: Sequence[Minute], now: datetime, queue: str | None = None) -> Hour:
    """``minutes`` of ``queue`` (None: all) in the :data:`SPAN` minutes up
    to ``now``'s (the database's clock), summed over kinds per minute and over minutes per kind."""
    end = now.astimezone(timezone.utc).replace(second=0, microsecond=0)
    slots = [end - timedelta(minutes=SPAN - 1 - i) for i in range(SPAN)]
    index = {slot: i for i, slot in enumerate(slots)}
    per_minute = [Total("", "") for _ in slots]
    totals: dict[tuple[str, str], Total] = {}
    queues: set[str] = set()
    for m in minutes:
        i = index.get(m.minute.replace(second=0, microsecond=0))
        if i is None:
            continue
        queues.add(m.queue)
        if queue is not None and m.queue != queue:
            continue
        per_minute[i].add(m)
        totals.setdefault((m.queue, m.kind), Total(m.queue, m.kind)).add(m)
    return Hour(
        slots=slots,
        outcomes={o: [t.outcomes[o] for t in per_minute] for o in OUTCOMES},
        mean_pickup=[t.mean_pickup for t in per_minute],
        mean_run=[t.mean_run for t in per_minute],
        totals=[totals[k] for k in sorted(totals)],
        queues=sorted(queues),
    )
