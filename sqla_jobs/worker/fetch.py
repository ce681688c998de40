"""The fetch loop: when a worker writes outcomes, claims, gives back, parks and polls.

One fetch loop per lane claims for all the worker's slots at once, so a wakeup costs one claim
however many slots are idle (no thundering herd of empty claims). Polling every
``poll_interval`` is the floor under the wakeups.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from sqla_jobs.db.connections import CONNECTION_ERRORS, Reconnects
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.handoff import Handoff
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.lanes import Lane, Lanes
from sqla_jobs.worker.prefetch import Prefetch
from sqla_jobs.worker.slots import Slots
from sqla_jobs.worker.wakeups import Wakeups

log = logging.getLogger("sqla_jobs.worker")

#: How long a finished job's outcome may wait to be written with others (or with the next claim).
FLUSH_DELAY = 0.05
#: How long prefetched jobs may wait for a free slot before they go back to the queue.
BUFFER_MAX_WAIT = 1.0
#: A lane other than the first sleeps until woken, or this long (seconds).
_IDLE_LANE_WAIT = 3600.0


class FetchLoop:
    """The decisions of a worker's fetch loops, over its holdings, lanes and slots."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        holdings: Holdings,
        lanes: Lanes,
        slots: Slots,
        prefetch: Prefetch,
        wakeups: Wakeups,
        handoff: Handoff | None,
    ) -> None:
        self._config = config
        self._holdings = holdings
        self._lanes = lanes
        self._slots = slots
        self._prefetch = prefetch
        self._wakeups = wakeups
        self._handoff = handoff
        #: The wakeup count when the polling floor last fired: the claim it causes asks
        #: Lanes.claimable first, unless a wakeup came since (a NOTIFY claims as it always did).
        self._polled: int | None = None

    async def run(self) -> None:
        """Run every lane's loop until stopped; an unexpected error in one stops them all (after
        their round trips in flight end) and is raised."""
        loops = [
            asyncio.create_task(self._loop(lane), name=f"sqla-jobs-fetch-{lane.index}")
            for lane in self._lanes.lanes
        ]
        try:
            _, pending = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            raise
        if pending:
            self._wakeups.stopping = True
            self._wakeups.event.set()
            await asyncio.wait(pending)
        for loop in loops:
            loop.result()

    async def _loop(self, lane: Lane) -> None:
        wakeups = self._wakeups
        reconnects = Reconnects("database connection", "conn_lost")
        while not wakeups.stopping:
            wakeups.event.clear()
            self._slots.fill()
            try:
                progressed = await self._step(lane)
                reconnects.ok()
            except CONNECTION_ERRORS as exc:
                delay = reconnects.lost(exc)
                await self._lanes.close(lane)
                await wakeups.sleep(delay)
                if lane.index == 0:
                    try:
                        await self._lanes.connection(lane)
                    except CONNECTION_ERRORS:
                        pass
                continue
            except psycopg.Error as exc:
                # Not a lost connection (a claim the server refused): keep the worker alive,
                # and try again after a pause rather than in a busy loop.
                delay = reconnects.lost(exc)
                log.exception("claim failed", extra={"event": "claim_failed"})
                await wakeups.sleep(delay)
                continue
            self._slots.fill()
            if progressed:
                continue
            if lane.index:
                # Only lane 0 parks, polls and keeps the timers: the others act while it is busy,
                # woken by what gives them something to do. No timer of their own: it would
                # wake lane 0 too, out of its park.
                await wakeups.sleep(_IDLE_LANE_WAIT)
                continue
            if self._handoff is not None:
                self._handoff.park(self._room())
            await wakeups.sleep(self._wait_seconds())
            if self._handoff is not None:
                self._handoff.unpark()
            if (
                wakeups.drained
                and time.monotonic() - wakeups.last_claim >= self._config.poll_interval
            ):
                wakeups.drained = False  # the polling floor
                self._polled = wakeups.count

    def _room(self) -> int:
        return self._holdings.room(self._config.concurrency, self._prefetch.size)

    def _wait_seconds(self) -> float:
        holdings, wakeups = self._holdings, self._wakeups
        if holdings.finished:
            # Outcomes wait a moment to be written together (or with the next claim).
            return max(0.0, holdings.finished_since + FLUSH_DELAY - time.monotonic())
        if holdings.buffer:
            return max(0.0, holdings.buffered_at + BUFFER_MAX_WAIT - time.monotonic())
        if wakeups.drained:
            return max(0.0, wakeups.last_claim + self._config.poll_interval - time.monotonic())
        return self._config.poll_interval

    async def _step(self, lane: Lane) -> bool:
        """Write outcomes and/or claim on ``lane``, when worth a round trip; True if it claimed a
        full batch."""
        wakeups, holdings = self._wakeups, self._holdings
        if lane.index > wakeups.in_flight:
            return False  # the lanes before it are free: theirs to do
        room = self._room()
        want_claim = self.want_claim(room)
        now = time.monotonic()
        limit = self._prefetch.limit
        want_flush = bool(holdings.finished) and (
            want_claim
            or len(holdings.finished) >= limit
            or not holdings.busy()
            or now - holdings.finished_since >= FLUSH_DELAY
        )
        if holdings.buffer and now - holdings.buffered_at > BUFFER_MAX_WAIT:
            # Prefetched jobs that could not start in time go back to the queue for idle
            # workers, instead of waiting behind this worker's long-running handlers. Taken out
            # first: the other lane may buffer new claims while this release waits.
            stale = holdings.take_buffer()
            try:
                await self._lanes.release(stale, lane)
            except BaseException:
                holdings.restore_buffer(stale)
                raise
        queues: list[str] | None = None
        if want_claim and self._polled is not None:
            queues = await self._probe(lane)
            want_claim = queues is None or bool(queues)
        if not (want_claim or want_flush):
            return False
        limit = min(room, limit) if want_claim else 0
        count = wakeups.count
        claimed = await self._lanes.write_and_claim(limit, lane, queues)
        if want_claim:
            wakeups.last_claim = time.monotonic()
            # Fewer than asked: the queue is empty for now. But a wakeup that arrived while the
            # claim was in flight may announce a job committed after the claim's snapshot.
            wakeups.drained = claimed < limit and wakeups.count == count
        return want_claim and not wakeups.drained

    async def _probe(self, lane: Lane) -> list[str] | None:
        """For the poll: the queues with something to claim (an empty list: none, and the
        worker is drained again); None to claim every queue (a wakeup came since the poll)."""
        wakeups = self._wakeups
        polled, self._polled = self._polled, None
        if wakeups.count != polled or not self._lanes.probes:
            return None
        queues = await self._lanes.claimable(lane)
        if wakeups.count != polled:
            return None  # a NOTIFY came while the probe was in flight
        if not queues:
            wakeups.last_claim = time.monotonic()
            wakeups.drained = True
        return queues

    def want_claim(self, room: int | None = None) -> bool:
        """Whether to claim now: refill when the local buffer runs low (claims come in batches,
        and a batch's completions ride along with the next claim), only while a slot is free (a
        worker whose slots are all busy must not take jobs it cannot start)."""
        holdings, wakeups, prefetch = self._holdings, self._wakeups, self._prefetch
        # The buffer test first: it is the one that fails while a busy worker has work.
        if len(holdings.buffer) > prefetch.size // 2:
            return False
        if room is None:
            room = self._room()
        return (
            not wakeups.drained
            and not (self._handoff is not None and self._handoff.thread_claim)
            and wakeups.in_flight < len(self._lanes.lanes)
            and room > 0
            and len(holdings.running) < self._config.concurrency
            and (room >= prefetch.limit // 2 or not (holdings.busy() or holdings.reserved))
        )

    def has_work(self) -> bool:
        """Whether a job's end gives the fetch loop something to do now: a first outcome to
        schedule a write for, a full batch of outcomes, an idle worker, or room to claim. Jobs
        that end otherwise do not wake it (a wakeup per job is measurable at thousands per
        second); the loop's own timers cover the rest."""
        holdings = self._holdings
        finished = len(holdings.finished)
        if finished == 1 or not (holdings.running or holdings.buffer or holdings.deferred):
            return True
        return finished >= self._prefetch.limit or self.want_claim()
