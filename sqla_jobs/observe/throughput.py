"""Per-minute throughput as the workers recorded it: the implementation of :mod:`sqla_jobs.throughput`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from sqla_jobs.jobs import Jobs
from sqla_jobs.kinds import check_name
from sqla_jobs.sql import metrics as metrics_sql

__all__ = ["Minute", "recent"]

_READ = metrics_sql.read_throughput()


@dataclass(frozen=True)
class Minute:
    """What the workers finished in one minute, in one queue, of one kind."""

    #: The start of the minute (UTC), by the database's clock.
    minute: datetime
    queue: str
    kind: str
    completed: int
    #: Failed runs that will be retried.
    failed: int
    dead: int
    cancelled: int
    snoozed: int
    #: Jobs rescued by a reaper from a worker that stopped heartbeating.
    crashed: int
    #: Handler runs, and their total duration in seconds.
    runs: int
    run_seconds: float
    #: Jobs started, and their total wait from ``run_at`` to their start in seconds.
    pickups: int
    pickup_seconds: float

    @property
    def finished(self) -> int:
        """Runs that ended this minute, whatever their outcome (crashes apart)."""
        return self.completed + self.failed + self.dead + self.cancelled + self.snoozed

    @property
    def mean_run_seconds(self) -> float | None:
        """The mean run time, or None if no run was timed."""
        return self.run_seconds / self.runs if self.runs else None

    @property
    def mean_pickup_seconds(self) -> float | None:
        """The mean wait from ``run_at`` to the start, or None if no job started."""
        return self.pickup_seconds / self.pickups if self.pickups else None


def recent(
    session: Session, jobs: Jobs, *, minutes: int = 60, queue: str | None = None
) -> list[Minute]:
    """The recorded minutes of the last ``minutes`` (the current one included), oldest first,
    one per queue and kind that finished something; only ``queue``'s if given. Reads in the
    caller's transaction, locks nothing. Minutes without a row had nothing finished."""
    if not 1 <= minutes <= 7 * 24 * 60:
        raise ValueError(f"minutes must be 1 to {7 * 24 * 60}, got {minutes}")
    if queue is not None:
        check_name("queue", queue)
    options = {} if jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}
    rows = session.execute(
        _READ, {"minutes": minutes, "queue": queue}, execution_options=options
    ).mappings()
    return [Minute(**row) for row in rows]
