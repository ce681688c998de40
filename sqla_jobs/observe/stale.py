"""Running jobs whose worker is stale: it missed two heartbeats (:mod:`sqla_jobs.observe.registry`),
so it is most likely dead, and the reaper takes its jobs back when their leases end.

``jobs list``, ``jobs show`` and the dashboard mark such a job, so that nobody waits on a job no
process runs any more. One read per listing, of the running jobs shown only; never on a worker's
path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from sqla_jobs.jobs import Jobs
from sqla_jobs.sql import workers as workers_sql


@dataclass(frozen=True)
class StaleHolder:
    """The stale worker a running job is held by."""

    worker: str
    #: Seconds since the worker's last heartbeat, by the database's clock.
    heartbeat_age: float
    #: When the job's lease ends: the reaper retakes it at its next pass after that.
    lease_expires_at: datetime

    def note(self) -> str:
        """One line for people: what is wrong, and what happens next."""
        return (
            f"running on a stale worker ({self.worker}, no heartbeat for "
            f"{self.heartbeat_age:.0f}s): the reaper retakes it when its lease ends at "
            f"{self.lease_expires_at.strftime('%Y-%m-%d %H:%M:%S')}"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "heartbeat_age_seconds": round(self.heartbeat_age, 3),
            "lease_expires_at": self.lease_expires_at.isoformat(),
        }


def stale_holders(session: Session, jobs: Jobs, running: Iterable[int]) -> dict[int, StaleHolder]:
    """Which of the ``running`` job ids are held by a stale worker (no read when there are none)."""
    ids = sorted(set(running))
    if not ids:
        return {}
    options = {} if jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}
    rows = session.execute(workers_sql.stale_worker_jobs(), {"ids": ids}, execution_options=options)
    return {
        int(r.id): StaleHolder(str(r.locked_by), float(r.heartbeat_age), r.lease_expires_at)
        for r in rows
    }
