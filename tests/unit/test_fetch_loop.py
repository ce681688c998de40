"""The fetch loop's decisions between its two lanes, without a database: the round trips are played
by a stand-in whose trips the test holds open and lets go, so the interleavings that lost a wakeup
on a loaded machine happen every time. (The round trips themselves run against PostgreSQL in the
integration suites.)"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sqla_jobs._outcome import Outcome
from sqla_jobs.db import connections
from sqla_jobs.db.connections import Reconnects
from sqla_jobs.db.outage import Outage
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.fetch import FetchLoop
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.lanes import Lane
from sqla_jobs.worker.prefetch import Prefetch
from sqla_jobs.worker.wakeups import Wakeups

from ._claimed import claimed_job
from .test_failover import KILLED, PRIMARY, Primary

#: Far longer than any wait below: a loop that sleeps for it has lost the event it waited for.
POLL = 30.0
#: How long a test waits for the loop to act (it acts within milliseconds when right).
PROMPT = 2.0


class Trip:
    """One round trip the loop started: its lane and limit, held open until :meth:`end`."""

    def __init__(self, lane: int, limit: int) -> None:
        self.lane = lane
        self.limit = limit
        self._claimed: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def end(self, claimed: int = 0) -> None:
        self._claimed.set_result(claimed)

    def fail(self, exc: BaseException) -> None:
        """The trip's connection was lost (or the server refused it)."""
        self._claimed.set_exception(exc)

    async def result(self) -> int:
        return await self._claimed


class ScriptedLanes:
    """The parts of ``Lanes`` the fetch loop calls, with each round trip held by the test. The
    accounting the real ``write_and_claim`` does around its trip (in flight, reserved, the batch
    taken) is done the same way."""

    def __init__(self, holdings: Holdings, wakeups: Wakeups, queues: list[str]) -> None:
        self.lanes = [Lane(0), Lane(1)]
        self._holdings = holdings
        self._wakeups = wakeups
        self._queues = queues
        self.trips: list[Trip] = []
        self.started = asyncio.Event()
        #: The next step at which the probe says something is due (None: nothing delayed).
        self.due_in: float | None = None
        #: Opens a lane's connection for a trip when it has none (None: the lanes stay without).
        self.reconnect: Callable[[], Any] | None = None

    async def write_and_claim(
        self, limit: int, lane: Lane | None = None, queues: list[str] | None = None
    ) -> int:
        lane = lane or self.lanes[0]
        if lane.conn is None and self.reconnect is not None:
            lane.conn = self.reconnect()  # as Lanes.connection opens one
        trip = Trip(lane.index, limit)
        self._wakeups.in_flight += 1
        self._holdings.reserved += limit
        self._holdings.finished = []
        self.trips.append(trip)
        self.started.set()
        try:
            return await trip.result()
        finally:
            self._wakeups.in_flight -= 1
            self._holdings.reserved -= limit

    async def claimable(self, lane: Lane) -> tuple[list[str], float | None]:
        return list(self._queues), self.due_in

    async def connection(self, lane: Lane) -> Any:
        if lane.conn is None and self.reconnect is not None:
            lane.conn = self.reconnect()
        return lane.conn

    async def close(self, lane: Lane | None = None) -> None:
        for each in [lane] if lane is not None else self.lanes:
            each.conn = None

    async def release(self, jobs: Any, lane: Lane) -> None:
        return None

    async def next_trip(self, after: int) -> Trip:
        """The round trip started after the first ``after`` ones; fails if none starts promptly."""

        async def started() -> Trip:
            while len(self.trips) <= after:
                self.started.clear()
                await self.started.wait()
            return self.trips[after]

        return await asyncio.wait_for(started(), PROMPT)


class Slots:
    def fill(self) -> None:
        return None


class ScriptedOrphans:
    """The give-back of orphaned jobs, held open by the test; records how many round trips were
    in flight when it began."""

    def __init__(self) -> None:
        self.due = False
        self.began: list[int] = []
        self.gate = asyncio.Event()

    async def release(self, conn: Any) -> int:
        self.began.append(len(self.trips_in_flight()))
        await self.gate.wait()
        self.due = False
        return 0

    def trips_in_flight(self) -> list[Trip]:
        return [t for t in self.lanes.trips if not t._claimed.done()]

    lanes: ScriptedLanes


def running_loop(
    test: Callable[[FetchLoop, ScriptedLanes, Wakeups, Holdings], Awaitable[None]],
    orphans: ScriptedOrphans | None = None,
    started: Callable[[ScriptedLanes], None] | None = None,
) -> None:
    async def main() -> None:
        wakeups = Wakeups(asyncio.get_running_loop())
        holdings = Holdings()
        config = WorkerConfig(queues=("q",), concurrency=4, poll_interval=POLL)
        lanes = ScriptedLanes(holdings, wakeups, ["q"])
        if orphans is not None:
            orphans.lanes = lanes
        fetch = FetchLoop(
            config=config,
            holdings=holdings,
            lanes=lanes,  # type: ignore[arg-type]
            slots=Slots(),  # type: ignore[arg-type]
            prefetch=Prefetch(config.concurrency),
            wakeups=wakeups,
            handoff=None,
            orphans=orphans,  # type: ignore[arg-type]
        )
        task = asyncio.create_task(fetch.run(None if started is None else lambda: started(lanes)))
        try:
            await test(fetch, lanes, wakeups, holdings)
        finally:
            wakeups.stopping = True
            wakeups.event.set()
            for trip in lanes.trips:
                if not trip._claimed.done():
                    trip.end()
            if orphans is not None:
                orphans.gate.set()
            await asyncio.wait_for(task, PROMPT)

    asyncio.run(main())


def test_the_worker_starts_its_threads_once_the_first_round_trip_is_in_flight() -> None:
    """``started`` (the worker's threads, whose connecting holds the GIL) runs while the first
    lane's first round trip is with the server, not before it is sent; and only once."""
    seen: list[list[bool]] = []

    def started(lanes: ScriptedLanes) -> None:
        seen.append([trip._claimed.done() for trip in lanes.trips])

    async def test(fetch: FetchLoop, lanes: ScriptedLanes, w: Wakeups, h: Holdings) -> None:
        first = await lanes.next_trip(0)
        await asyncio.wait_for(_until(lambda: bool(seen)), PROMPT)
        assert seen == [[False]]  # one trip, still in flight
        first.end(0)
        w.wake()
        again = await lanes.next_trip(1)
        again.end(0)
        await asyncio.sleep(0.01)
        assert len(seen) == 1

    running_loop(test, started=started)


async def idle(lanes: ScriptedLanes, wakeups: Wakeups) -> int:
    """Let the loop's first claim find nothing; the number of trips so far."""
    first = await lanes.next_trip(0)
    first.end(0)
    await asyncio.sleep(0.01)
    assert wakeups.drained
    return len(lanes.trips)


async def lane_one_claiming(lanes: ScriptedLanes, wakeups: Wakeups, holdings: Holdings) -> Trip:
    """Lane 0 writes an outcome (a trip without a claim) while a wakeup sends lane 1 to claim for
    every free slot; lane 0's trip then ends. Returns lane 1's trip, still in flight."""
    seen = await idle(lanes, wakeups)
    holdings.finished = [Outcome(claimed_job(1))]
    holdings.finished_since = time.monotonic()
    wakeups.event.set()
    flush = await lanes.next_trip(seen)
    assert (flush.lane, flush.limit) == (0, 0)
    wakeups.wake()  # a NOTIFY
    claim = await lanes.next_trip(seen + 1)
    assert claim.lane == 1
    assert claim.limit > 0
    flush.end(0)
    await asyncio.sleep(0.01)
    return claim


def test_a_wakeup_while_lane_one_claims_is_not_lost() -> None:
    """A NOTIFY that arrives while lane 1's claim is in flight (its snapshot may predate the job)
    makes the worker claim again once that claim is back, not a poll interval later: lane 0 could
    not claim meanwhile, since lane 1 held the room."""

    async def test(fetch: FetchLoop, lanes: ScriptedLanes, w: Wakeups, h: Holdings) -> None:
        claim = await lane_one_claiming(lanes, w, h)
        seen = len(lanes.trips)
        w.wake()  # the NOTIFY of a job committed after lane 1's snapshot
        await asyncio.sleep(0.01)
        assert len(lanes.trips) == seen  # no room to claim while lane 1 holds it
        claim.end(0)
        again = await lanes.next_trip(seen)
        assert again.limit > 0

    running_loop(test)


def test_a_start_learned_by_lane_one_is_kept_by_lane_zero() -> None:
    """A time something becomes claimable (a delayed job, a rate limiter's next start) learned
    while lane 1's claim is in flight wakes the worker then, not a poll interval later."""

    async def test(fetch: FetchLoop, lanes: ScriptedLanes, w: Wakeups, h: Holdings) -> None:
        claim = await lane_one_claiming(lanes, w, h)
        seen = len(lanes.trips)
        w.start_by(time.monotonic() + 0.2)  # what the rate limited claim tells the loop
        claim.end(0)
        poll = await lanes.next_trip(seen)
        assert poll.limit > 0

    running_loop(test)


def test_orphans_are_given_back_only_with_no_claim_in_flight_and_none_starts_meanwhile() -> None:
    """After a lost connection, the give-back of orphaned jobs waits for the claims in flight (a
    claimed row not yet held would look orphaned), and no lane claims until it is done."""
    orphans = ScriptedOrphans()

    async def test(fetch: FetchLoop, lanes: ScriptedLanes, w: Wakeups, h: Holdings) -> None:
        claim = await lane_one_claiming(lanes, w, h)
        orphans.due = True
        w.wake()
        await asyncio.sleep(0.05)
        assert orphans.began == []  # lane 1's claim is in flight
        seen = len(lanes.trips)
        claim.end(0)
        await asyncio.wait_for(_until(lambda: orphans.began != []), PROMPT)
        assert orphans.began == [0]
        w.wake()  # a NOTIFY while it runs: no claim starts
        await asyncio.sleep(0.05)
        assert len(lanes.trips) == seen
        orphans.gate.set()
        after = await lanes.next_trip(seen)
        assert after.limit > 0
        assert not orphans.due

    running_loop(test, orphans)


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.005)


def test_a_fault_on_lane_one_after_another_connections_outage_is_said(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lane 1 slept through an outage of another connection (it began and ended meanwhile); its
    connection lived through it. A fault on its next trip is a new outage, said: not an echo of
    the ended one (seen in CI, stop 30: a completion killed on lane 1 went unsaid)."""
    outage = Outage()
    monkeypatch.setattr(connections, "OUTAGE", outage)
    made: list[Primary] = []

    def connect() -> Primary:
        made.append(Primary())
        return made[-1]

    async def test(fetch: FetchLoop, lanes: ScriptedLanes, w: Wakeups, h: Holdings) -> None:
        for lane in lanes.lanes:
            lane.conn = connect()  # type: ignore[assignment]
        seen = await idle(lanes, w)
        h.finished = [Outcome(claimed_job(1))]
        h.finished_since = time.monotonic()
        w.event.set()
        flush = await lanes.next_trip(seen)
        assert flush.lane == 0
        await asyncio.sleep(0.01)  # lane 1 sleeps: nothing for it to do
        listener = Reconnects("listener", "listener_lost", outage=outage)
        listener.lost(KILLED)
        listener.ok(PRIMARY)  # that outage is over
        assert not outage.active
        w.wake()  # a NOTIFY: lane 1 claims while lane 0 writes
        claim = await lanes.next_trip(seen + 1)
        assert claim.lane == 1
        lanes.reconnect = connect
        claim.fail(KILLED)
        flush.end(0)
        # Lane 0 claims again (the lost claim's jobs are still due); lane 1, back from its
        # reconnect delay on a new connection, steps idle: that ends the outage its loss began.
        again = await lanes.next_trip(seen + 2)
        assert again.lane == 0
        await asyncio.sleep(0.3)
        again.end(0)
        await asyncio.sleep(0.01)
        assert not outage.active, "lane 1 is connected again, and the outage did not end"

    try:
        with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
            running_loop(test)
    finally:
        for each in made:
            each.sock.close()
            each.server.close()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(m.startswith("database connection lost (claim connection") for m in said), said
    assert said[-1].startswith("database back after"), said
    assert "claim connection works again" in said[-1], said


def test_after_a_full_claim_the_next_one_sends_lane_one_to_claim_beside_it() -> None:
    """A backlog (the last claim came back full): lane 1 claims while lane 0's next claim is in
    flight, not once the buffer has run down, so a busy worker has both lanes working from its
    second claim on."""

    async def test(fetch: FetchLoop, lanes: ScriptedLanes, w: Wakeups, h: Holdings) -> None:
        first = await lanes.next_trip(0)
        assert (first.lane, first.limit) == (0, 4)  # nothing measured yet: the free slots
        fetch._prefetch.resize(1e-6)  # the first jobs ran in a microsecond: the full prefetch
        first.end(4)
        second = await lanes.next_trip(1)
        assert second.lane == 0
        beside = await lanes.next_trip(2)
        assert beside.lane == 1
        assert beside.limit > 0
        assert not second._claimed.done()

    running_loop(test)


def test_after_a_short_claim_the_next_one_leaves_lane_one_asleep() -> None:
    """No backlog (the last claim came back short): a NOTIFY's claim goes out on lane 0 alone, and
    an idle worker keeps to one connection."""

    async def test(fetch: FetchLoop, lanes: ScriptedLanes, w: Wakeups, h: Holdings) -> None:
        fetch._prefetch.resize(1e-6)
        seen = await idle(lanes, w)
        w.wake()  # a NOTIFY
        claim = await lanes.next_trip(seen)
        assert (claim.lane, claim.limit) == (0, 4 + 1024)
        await asyncio.sleep(0.1)
        assert len(lanes.trips) == seen + 1

    running_loop(test)
