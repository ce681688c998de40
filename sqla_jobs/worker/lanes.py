"""The claim lanes: a worker's claim connections and their round trips.

A round trip writes the finished jobs' outcomes and claims the next batch in one psycopg pipeline
(one implicit transaction: a write that fails takes the claim down with it, so nothing is claimed
that is not read). Lane 0 is the worker's first connection; lane ``k`` opens (lazily) and starts a
round trip only while ``k`` others are in flight, so an idle or lightly loaded worker uses one
connection and a busy one keeps the server's work on several backends at once (one backend runs
a connection's statements one after another, and with short jobs the slots would wait for it).
A worker of one or two slots has one lane: see :data:`SECOND_LANE_FROM`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import psycopg

from sqla_jobs.context import ClaimedJob
from sqla_jobs.db.connections import (
    AsyncConn,
    Connector,
    aclose_quietly,
    should_reconnect,
)
from sqla_jobs.sql.catalog import IMMEDIATE_CONSTRAINTS
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.claim_txn import claim_transaction
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.leases import held_params
from sqla_jobs.worker.rated import RatedClaim
from sqla_jobs.worker.wakeups import Wakeups
from sqla_jobs.worker.writes import OutcomeWriter

log = logging.getLogger("sqla_jobs.worker")

#: Claim connections of a busy worker: a second round trip goes out while the first is in flight.
LANES = 2
#: The fewest slots for which a worker has a second lane. Fewer keep up on one (a claim comes back
#: before the prefetched jobs run out), and small workers are run many to a server, where each
#: second claim backend takes a core from the others' claims (bench/README.md).
SECOND_LANE_FROM = 3


@dataclass(eq=False)
class Lane:
    """A claim connection, and how many jobs were claimed on it."""

    index: int
    conn: AsyncConn | None = None
    claimed: int = 0
    #: Round trips that worked on it (its reconnect policy tells them from idle steps).
    trips: int = 0
    #: The job table has deferred triggers (an application's DEFERRABLE INITIALLY DEFERRED
    #: foreign key to it): each write pipeline makes them immediate first. Looked up at connect.
    immediate: bool = False


class Lanes:
    """The round trips of one worker: outcomes written, jobs claimed into ``holdings``."""

    def __init__(
        self,
        *,
        connector: Connector,
        sql: WorkerSQL,
        config: WorkerConfig,
        holdings: Holdings,
        wakeups: Wakeups,
        counts: dict[str, int],
        keyed: bool,
        rated: RatedClaim | None = None,
    ) -> None:
        self._connector = connector
        self._sql = sql
        self._config = config
        self._holdings = holdings
        self._wakeups = wakeups
        self._counts = counts
        self._keyed = keyed
        self._rated = rated
        self._lease = timedelta(seconds=config.lease)
        self._writer = OutcomeWriter(sql, config.keep_history, counts)
        #: Counts and logs a completion its handler's transaction committed.
        self.committed = self._writer.committed
        self.lanes = [
            Lane(i) for i in range(LANES if config.concurrency >= SECOND_LANE_FROM else 1)
        ]
        self._queue_turn = 0
        #: A release of ``Holdings.give_back`` is in flight (on one lane at a time).
        self._giving_back = False

    async def connection(self, lane: Lane) -> AsyncConn:
        """``lane``'s connection, opened if it has none."""
        if lane.conn is None or lane.conn.closed:
            role = f"claim{lane.index + 1}" if lane.index else "claim"
            return await self.adopt(lane, await self._connector.aconnect(role))
        return lane.conn

    async def adopt(self, lane: Lane, conn: AsyncConn) -> AsyncConn:
        """Make ``conn`` (a new connection) ``lane``'s, in place of a closed one or none;
        returns it."""
        lane.conn = conn
        # Once per connection, so a foreign key added while the worker runs is found at the
        # reconnect that its first failed pipeline causes.
        deferred = self._sql.deferred_job_triggers
        cur = await conn.execute(deferred.sql, deferred.params(job_table=self._sql.job_table))
        found = await cur.fetchone()
        lane.immediate = bool(found and found[0])
        return conn

    async def close(self, lane: Lane | None = None) -> None:
        """Close ``lane``'s connection (default: every lane's)."""
        for each in [lane] if lane is not None else self.lanes:
            conn, each.conn = each.conn, None
            await aclose_quietly(conn)

    def claim_params(self, queue: str, limit: int) -> dict[str, Any]:
        """The claim's parameters, with the crash rule for what the worker holds now."""
        return self._sql.claim.params(
            queue=queue,
            limit=limit,
            lease=self._lease,
            worker=self._connector.worker,
            monotonic_us=time.monotonic_ns() // 1000,
            **self._holdings.crash_params(),
        )

    async def claimable(self, lane: Lane) -> tuple[list[str], float | None]:
        """The worker's queues that have a job to claim now (not paused; keyed jobs counted when
        the worker runs keyed kinds), and the seconds until the next of their unkeyed jobs becomes
        due (None if none), in one statement on ``lane``. Reads only; locks nothing."""
        conn = await self.connection(lane)
        probe = self._sql.claimable_queues
        cur = await conn.execute(
            probe.sql, probe.params(queues=list(self._config.queues), keyed=self._keyed)
        )
        queues: list[str] = []
        waits: list[float] = []
        for queue, due, wait in await cur.fetchall():
            # With rate limited kinds, every queue: the rate limited claim itself finds out
            # whether a limiter has room (a poll's cost, never a busy loop).
            if due or self._rated is not None:
                queues.append(str(queue))
            if wait is not None:
                waits.append(float(cast(float, wait)))
        return queues, min(waits, default=None)

    async def write_and_claim(
        self, limit: int, lane: Lane | None = None, queues: list[str] | None = None
    ) -> int:
        """Write the finished jobs' outcomes and claim up to ``limit`` jobs on ``lane`` (default
        the first) in one round trip, from ``queues`` (default every queue the worker serves);
        the number claimed."""
        lane = lane or self.lanes[0]
        self._wakeups.in_flight += 1
        self._holdings.reserved += limit
        try:
            return await self._round_trip(limit, lane, queues or list(self._config.queues))
        finally:
            self._wakeups.in_flight -= 1
            self._holdings.reserved -= limit

    async def flush(self) -> None:
        """Write every finished job's outcome now."""
        if self._holdings.finished:
            await self.write_and_claim(0)

    async def _round_trip(self, limit: int, lane: Lane, queues: list[str]) -> int:
        holdings = self._holdings
        first = queues[self._queue_turn % len(queues)]
        self._queue_turn += 1
        batch, holdings.finished = holdings.finished, []
        holdings.writing[lane.index] = batch
        try:
            # Inside the try: a reconnect that fails must not drop the outcomes it was to write.
            conn = await self.connection(lane)
            try:
                if batch:
                    async with conn.pipeline():
                        if lane.immediate:
                            await conn.execute(IMMEDIATE_CONSTRAINTS)
                        sent = await self._writer.send(conn, batch)
                        if not lane.immediate:
                            # Children these outcomes release (job dependencies) are settled
                            # now, all at once, so this claim can take them: the NOTIFY of
                            # their release reaches the other workers only at the commit.
                            await conn.execute(IMMEDIATE_CONSTRAINTS)
                        claim_cur = await self._claim(conn, first, limit)
                else:
                    # Nothing to write (an idle worker woken by a NOTIFY): a lone claim, without
                    # the pipeline's setup and Sync, picks the job up sooner.
                    sent = ([], [], [])
                    claim_cur = await self._claim(conn, first, limit)
            except psycopg.Error as exc:
                if should_reconnect(exc) or not batch:
                    raise
                # Not a lost connection: one write of the batch failed, and with it the whole
                # pipeline (the claim too). Write each outcome on its own.
                log.warning(
                    "writing %d outcomes failed (%s: %s); writing them one at a time",
                    len(batch),
                    type(exc).__name__,
                    str(exc).splitlines()[0],
                    extra={"event": "write_failed"},
                )
                # On a fresh connection: psycopg records a statement as prepared when it sends
                # its Parse, which the server skipped in the aborted pipeline; on this one, each
                # later run of that statement would fail ("prepared statement does not exist").
                await self.close(lane)
                conn = await self.connection(lane)
                holdings.finished = await self._writer.isolate(conn, batch) + holdings.finished
                return 0
        except BaseException:
            # Not known to be written: keep them for the next try (the writes are fenced, so
            # writing one twice changes nothing).
            holdings.finished = batch + holdings.finished
            raise
        finally:
            holdings.writing.pop(lane.index, None)
        await self._writer.read(*sent)
        now = time.monotonic()
        claimed = 0
        if claim_cur is not None:
            claimed = holdings.take(await claim_cur.fetchall(), now)
        # Other queues (in turn) and keyed jobs, when the first queue did not fill the batch.
        for queue in queues:
            if claimed >= limit:
                break
            if queue != first:
                cur = await conn.execute(
                    self._sql.claim.sql, self.claim_params(queue, limit - claimed)
                )
                claimed += holdings.take(await cur.fetchall(), now)
        if self._keyed:
            for queue in queues:
                if claimed >= limit:
                    break
                claimed += await self._claim_keyed(conn, queue, limit - claimed)
        if self._rated is not None:
            for queue in queues:
                # Only for slots free now, never into the prefetch buffer: a buffered job given
                # back after waiting for a slot would have spent its start for nothing.
                free = self._config.concurrency - len(holdings.running) - len(holdings.buffer)
                free = min(limit - claimed, free - len(holdings.deferred))
                if free <= 0:
                    break
                claimed += await self._rated.claim(conn, queue, free, self.claim_params)
        self._counts["claimed"] += claimed
        lane.claimed += claimed
        await self.give_back(lane)
        return claimed

    async def give_back(self, lane: Lane) -> None:
        """Release the jobs the crash rule gave back (``Holdings.give_back``), if any."""
        holdings = self._holdings
        if not holdings.give_back or self._giving_back:
            return  # nothing to give back, or the other lane's release is on its way
        batch = list(holdings.give_back)
        self._giving_back = True
        try:
            await self.release(batch, lane)
        finally:
            self._giving_back = False
        # Out of the holdings only once released: a crashed job waits until then (Slots._slot).
        sent = {id(j) for j in batch}
        holdings.give_back = [j for j in holdings.give_back if id(j) not in sent]

    async def _claim(
        self, conn: AsyncConn, queue: str, limit: int
    ) -> psycopg.AsyncCursor[tuple[object, ...]] | None:
        if not limit:
            return None
        return await conn.execute(self._sql.claim.sql, self.claim_params(queue, limit))

    async def _claim_keyed(self, conn: AsyncConn, queue: str, limit: int) -> int:
        # Two statements in one transaction: the keys' advisory locks are granted by the first, so
        # the second's snapshot sees every claim their previous holders committed.
        lock, claim = self._sql.lock_keys, self._sql.claim_keyed
        async with claim_transaction(conn):
            cur = await conn.execute(lock.sql, lock.params(queue=queue, scan=limit))
            keys = [row[0] for row in await cur.fetchall()]
            if not keys:
                return 0
            cur = await conn.execute(
                claim.sql,
                claim.params(
                    queue=queue,
                    keys=keys,
                    limit=limit,
                    lease=self._lease,
                    worker=self._connector.worker,
                    monotonic_us=time.monotonic_ns() // 1000,
                    **self._holdings.crash_params(),
                ),
            )
            rows = await cur.fetchall()
        return self._holdings.take(rows, time.monotonic())

    async def release(
        self,
        jobs: list[ClaimedJob],
        lane: Lane | None = None,
        *,
        interrupted: bool = False,
        level: int = logging.INFO,
    ) -> None:
        """Give claimed jobs back (on ``lane``, default the first): pending again, the claim's
        attempt undone, not a failure; ``interrupted``: their handlers had started. The log line
        at ``level`` names the jobs."""
        if not jobs:
            return
        conn = await self.connection(lane or self.lanes[0])
        pairs = [(j.id, j.lease_token) for j in jobs]
        cur = await conn.execute(
            self._sql.release.sql,
            self._sql.release.params(interrupted=interrupted, **held_params(pairs)),
        )
        released = [row[0] for row in await cur.fetchall()]
        self._counts["released"] += len(released)
        plural = len(released) != 1
        what = ("interrupted job" if interrupted else "claimed job") + ("s" if plural else "")
        started = ""
        if interrupted:
            started = " (their handlers had started)" if plural else " (its handler had started)"
        log.log(
            level,
            "released %d %s back to the queue%s: %s",
            len(released),
            what,
            started,
            some_ids(released),
            extra={"event": "released"},
        )


def some_ids(ids: Sequence[object], shown: int = 10) -> str:
    """``ids`` for a log line: the first ``shown`` of them, and how many more."""
    listed = ", ".join(str(i) for i in ids[:shown])
    return listed if len(ids) <= shown else f"{listed} and {len(ids) - shown} more"
