"""After a lost connection: give back the jobs the table says this worker runs, under leases it no
longer holds.

A failover that loses commits (asynchronous replication: the new primary never got the last WAL)
can leave a job ``running`` under this worker's name with a lease the worker dropped: its
completion, or its release, was committed on the old primary only. Left alone, the reaper would
put it back once its lease ran out and charge it a crash (with ``max_crashes=1``, dead). The fetch
loop runs :meth:`Orphans.release` once after its connection was lost, on lane 0 with no claim in
flight and none starting (a claimed row not yet in the holdings would look orphaned). After an
outage without lost commits it finds nothing: one statement on the running rows' index.
"""

from __future__ import annotations

import logging

from sqla_jobs.db.connections import AsyncConn
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.wakeups import Wakeups

log = logging.getLogger("sqla_jobs.worker")


class Orphans:
    """The give-back of worker ``worker``'s orphaned jobs, after an outage."""

    def __init__(
        self,
        *,
        sql: WorkerSQL,
        worker: str,
        holdings: Holdings,
        wakeups: Wakeups,
        counts: dict[str, int],
    ) -> None:
        self._sql = sql
        self._worker = worker
        self._holdings = holdings
        self._wakeups = wakeups
        self._counts = counts
        #: A connection was lost since the last give-back: the next chance runs one.
        self.due = False

    async def release(self, conn: AsyncConn) -> int:
        """Give the orphans back on ``conn``; the number given back. The caller makes sure no
        claim is in flight or starts meanwhile."""
        stmt = self._sql.release_orphans
        tokens = [token for _, token in self._holdings.snapshot()]
        cur = await conn.execute(stmt.sql, stmt.params(worker=self._worker, tokens=tokens))
        rows = await cur.fetchall()
        self.due = False
        for job_id, kind, state in rows:
            # One line per job, as for a run the outage cut off (event run_lost).
            log.warning(
                "job %s (%s): the database lost its end with the outage (a commit the new primary "
                "never got); it is %s again, no attempt or crash charged",
                job_id,
                kind,
                state,
                extra={"event": "orphan_given_back", "job_id": job_id},
            )
        if rows:
            self._counts["released"] += len(rows)
            self._wakeups.undrain()  # they may be claimed again at once
        return len(rows)
