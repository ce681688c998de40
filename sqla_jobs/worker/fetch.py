"""The fetch loop: when a worker writes outcomes, claims, gives back, parks and polls.

One fetch loop per lane claims for all the worker's slots at once, so a wakeup costs one claim
however many slots are idle (no thundering herd of empty claims). Polling every
``poll_interval`` is the floor under the wakeups.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg

from sqla_jobs.db.connections import Reconnects, reconnect_delay, should_reconnect
from sqla_jobs.enqueue.payloads import HORIZON
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.handoff import Handoff
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.lanes import Lane, Lanes
from sqla_jobs.worker.orphans import Orphans
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
#: Seconds added to the time a delayed job becomes due, for the wait until then.
START_MARGIN = 0.001


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
        orphans: Orphans | None = None,
    ) -> None:
        self._config = config
        self._holdings = holdings
        self._lanes = lanes
        self._slots = slots
        self._prefetch = prefetch
        self._wakeups = wakeups
        self._handoff = handoff
        self._orphans = orphans
        #: The wakeup count when the poll last fired (the floor, or a delayed job's time): the
        #: claim it causes asks Lanes.claimable first, which also tells when the next delayed job
        #: is due; it claims only the queues listed, unless a wakeup came since.
        #: The first claim polls too: a worker learns at once when the jobs it finds delayed
        #: become due.
        self._polled: int | None = wakeups.count
        #: The idle poll's period: the poll interval, but at least as often as enqueue announces
        #: delayed jobs ahead (HORIZON), or one due within a longer interval could be missed.
        self._poll_every = min(config.poll_interval, HORIZON)
        #: The last claim came back full: there is a backlog, which the next lane may share.
        self._full = False

    async def run(self, started: Callable[[], None] | None = None) -> None:
        """Run every lane's loop until stopped, calling ``started`` once the first lane's first
        round trip is on its way; an unexpected error in one stops them all (after their round
        trips in flight end) and is raised."""
        loops = [
            asyncio.create_task(self._loop(lane), name=f"sqla-jobs-fetch-{lane.index}")
            for lane in self._lanes.lanes
        ]
        try:
            if started is not None:
                # One turn of the loop: the lanes' first steps run (the loop runs ready tasks in
                # the order they were scheduled), so lane 0's first round trip is out when the
                # worker's threads start; connecting, they would hold the GIL while it is sent.
                await asyncio.sleep(0)
                started()
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
        reconnects = Reconnects("claim connection", "conn_lost")
        refused = 0
        while not wakeups.stopping:
            wakeups.event.clear()
            self._slots.fill()
            since = reconnects.mark()
            if not reconnects.failures:
                # Before the lane's next trip: an idle connection that lived through another
                # connection's outage (its socket quiet) reports its own next fault as news, not
                # as that outage's echo. One comparison unless an outage came since it worked.
                reconnects.ok(lane.conn, used=False, since=since)
            try:
                trips = lane.trips
                progressed = await self._step(lane)
                if lane.conn is not None:
                    # A step without a connection (lane 1 idle since its loss) says nothing: its
                    # failure stands until a connection of its own works, which ends the outage.
                    reconnects.ok(lane.conn, used=lane.trips != trips, since=since)
                refused = 0
            except psycopg.Error as exc:
                if should_reconnect(exc):
                    if self._orphans is not None:
                        self._orphans.due = True
                    delay = reconnects.lost(exc)
                    await self._lanes.close(lane)
                    await wakeups.sleep(delay)
                    # Every lane, the idle second one too: its next step on the new connection
                    # ends the outage its loss began (later faults are then said as news).
                    try:
                        await self._lanes.connection(lane)
                    except psycopg.Error as again:
                        if not should_reconnect(again):
                            raise
                    continue
                # Not a lost connection (a claim the server refused): keep the worker alive,
                # and try again after a pause rather than in a busy loop. The traceback once per
                # run of refusals, not at every retry.
                refused += 1
                delay = reconnect_delay(refused)
                if refused == 1:
                    log.exception("claim failed", extra={"event": "claim_failed"})
                else:
                    log.debug("claim failed again: %s", exc, extra={"event": "claim_failed"})
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
            if self._poll_due(time.monotonic()) and wakeups.drained:
                wakeups.drained = False  # the polling floor, or a delayed job's time
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
        now = time.monotonic()
        # Not drained, yet nothing to do now: the slots are full, or the other lane's claim holds
        # the room. Its end wakes the loop, but a start known to come sooner is kept all the same.
        until = wakeups.last_claim + self._poll_every if wakeups.drained else now + self._poll_every
        if wakeups.next_start is not None:
            until = min(until, wakeups.next_start)
        return max(0.0, until - now)

    def _poll_due(self, now: float) -> bool:
        """Whether a drained worker polls now: the polling floor is due, or the next start it
        knows of has come (consumed, drained or not: the probe finds the one after it)."""
        wakeups = self._wakeups
        if wakeups.next_start is not None and now >= wakeups.next_start:
            wakeups.next_start = None
            return True
        return now - wakeups.last_claim >= self._poll_every

    async def _step(self, lane: Lane) -> bool:
        """Write outcomes and/or claim on ``lane``, when worth a round trip; True if it claimed a
        full batch."""
        wakeups, holdings = self._wakeups, self._holdings
        if lane.index > wakeups.in_flight:
            return False  # the lanes before it are free: theirs to do
        if self._orphans is not None and self._orphans.due and self._may_give_back(lane):
            await self._give_back_orphans(lane)
        if holdings.give_back:
            # Taken by the listener's claim (the hand-off): a crashed job waits for this release.
            await self._lanes.give_back(lane)
            lane.trips += 1
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
                lane.trips += 1
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
        if want_claim and self._full and lane.index + 1 < len(self._lanes.lanes):
            # A backlog: the next lane claims beside this one if the room allows (it decides
            # once this claim is in flight), rather than when the buffer has run down.
            wakeups.event.set()
        claimed = await self._lanes.write_and_claim(limit, lane, queues)
        lane.trips += 1
        if want_claim:
            self._full = claimed >= limit
            wakeups.last_claim = time.monotonic()
            # Fewer than asked: the queue is empty for now. But a wakeup that arrived while the
            # claim was in flight may announce a job committed after the claim's snapshot.
            wakeups.drained = claimed < limit and wakeups.count == count
            if lane.index and claimed < limit:
                # Lane 0 may have slept through that wakeup, or through a start this claim
                # learned, for want of the room this claim held: it decides again now.
                wakeups.event.set()
        return want_claim and not wakeups.drained

    def _may_give_back(self, lane: Lane) -> bool:
        """Whether no claim is in flight: every job claimed so far is in the holdings."""
        handoff = self._handoff
        return (
            lane.index == 0
            and not self._wakeups.in_flight
            and not (handoff is not None and handoff.thread_claim)
        )

    async def _give_back_orphans(self, lane: Lane) -> None:
        assert self._orphans is not None
        wakeups = self._wakeups
        # Every lane counts as busy meanwhile: no claim starts, and lane 0 does not park.
        busy = len(self._lanes.lanes)
        wakeups.in_flight += busy
        try:
            await self._orphans.release(await self._lanes.connection(lane))
            lane.trips += 1
        finally:
            wakeups.in_flight -= busy

    async def _probe(self, lane: Lane) -> list[str] | None:
        """For the poll: the queues with something to claim (an empty list: none, and the
        worker is drained again); None to claim every queue (a wakeup came since the poll)."""
        wakeups = self._wakeups
        polled, self._polled = self._polled, None
        # Even after a wakeup: the probe is also how the worker learns when the next delayed job
        # becomes due (on the database's clock), and a poll must not lose that.
        queues, wait = await self._lanes.claimable(lane)
        lane.trips += 1
        if wait is not None:
            # A millisecond late rather than early: the loop's timer may fire a little early.
            wakeups.start_by(time.monotonic() + wait + START_MARGIN)
        if wakeups.count != polled:
            return None  # a NOTIFY came since the poll: claim every queue, as it always did
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
