"""The worker: wait -> claim a batch -> run handlers -> complete or fail, with a graceful stop.

One fetch loop per process claims for all its handler slots at once, so a wakeup costs one claim
however many slots are idle (no thundering herd of empty claims). A busy worker runs a second one
on a second connection, which claims while the first one's round trip is in flight: one backend
runs a connection's statements one after another, and with short jobs the slots would otherwise
wait for it. Handlers run as asyncio tasks;
sync handlers run in a thread pool. Leases are kept alive by a separate thread
(:mod:`sqla_jobs._leases`), wakeups come from a dedicated LISTEN connection in a thread of its own
(:mod:`sqla_jobs._listener`), and polling every ``poll_interval`` is the floor. An idle worker lets
the listener's thread claim the moment a notification arrives, on the LISTEN connection: the
shortest path from an enqueuing COMMIT to a running handler.

Delivery is at-least-once: a job whose worker dies is run again after its lease expires, so
handlers must be idempotent.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.string import TextLoader
from pydantic import ValidationError

from ._config import WorkerConfig, check_config
from ._connections import CONNECTION_ERRORS, aclose_quietly, reconnect_delay
from ._db import KEEPALIVES, libpq_conninfo
from ._leases import LeaseKeeper
from ._listener import Connection as ListenConnection
from ._listener import Listener
from ._sql import WorkerSQL
from ._steps import StepWriter
from ._threads import SyncRunners
from .backoff import DEFAULT_BACKOFF, Backoff
from .context import ClaimedJob, JobContext
from .jobs import Jobs
from .kinds import Kind, describe_errors, load_payload
from .model import MAX_ERROR_CHARS

log = logging.getLogger("sqla_jobs.worker")

#: Exit code of a worker forced out by a second signal.
EXIT_FORCED = 130


#: How long a finished job's outcome may wait to be written with others (or with the next claim).
_FLUSH_DELAY = 0.05
#: Handlers faster than this on average get an automatic prefetch (seconds).
_SHORT_JOB = 0.05
#: The automatic prefetch holds about this much work per slot (seconds of average run time)...
_PREFETCH_HORIZON = 0.1
#: ... and at most this many jobs.
_PREFETCH_CAP = 512
#: ... and a claim asks for at most this many of them: two claims of a busy worker can be in flight
#: at once (see _Lane), each short enough for the server to answer in about a millisecond.
_CLAIM_CAP = 128
#: How long prefetched jobs may wait for a free slot before they go back to the queue.
_BUFFER_MAX_WAIT = 1.0
#: A slot yields to the event loop at least once per this many jobs.
_YIELD_EVERY = 16
#: Claim connections of a busy worker: a second round trip goes out while the first is in flight.
_LANES = 2
#: A lane other than the first sleeps until woken, or this long (seconds).
_IDLE_LANE_WAIT = 3600.0


class HandlerTimeout(Exception):
    """The handler ran past its kind's timeout (an async one is cancelled; a sync one cannot be,
    and runs on in its thread, its result discarded)."""


@dataclass
class _Finished:
    job: ClaimedJob
    error: str | None = None
    dead: bool = False
    backoff: Backoff = DEFAULT_BACKOFF


@dataclass(eq=False)
class _Lane:
    """A claim connection and its fetch loop. Lane 0 is the worker's first connection; lane ``k``
    opens (lazily) and starts a round trip only while ``k`` others are in flight, so an idle or
    lightly loaded worker uses one connection and a busy one keeps the server's work on several
    backends at once (one backend runs a worker's claims one after another)."""

    index: int
    conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
    #: Outcomes the round trip in flight carries: still this worker's jobs until written.
    writing: list[_Finished] = field(default_factory=list)
    #: Jobs claimed on this lane so far.
    claimed: int = 0


def _pg_array(values: list[Any]) -> str:
    """A list of ints or UUIDs as a Postgres array literal (the statement casts it): for the
    per-batch completion, where psycopg's array dumper costs a regex search per element."""
    return "{" + ",".join(map(str, values)) + "}"


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    # Truncated here too (the fail statement truncates again): logs must not carry trace storms.
    return f"{type(exc).__name__}: {exc}"[: MAX_ERROR_CHARS - len(where)] + where


class Worker:
    """Runs the handlers of ``jobs`` for jobs in ``queues`` (default: the queues of the kinds that
    have handlers).

    ``concurrency`` handlers run at once. A claimed job holds a lease of ``lease`` seconds, renewed
    every ``heartbeat`` (default a third of the lease) while it runs; an expired lease is reaped by
    any worker and the job runs again (at-least-once). Up to ``prefetch`` claimed jobs wait
    locally for a free slot, so a busy worker claims and completes in batches, one round trip per
    batch (on a second connection too, opened once the first has a round trip in flight and the
    slots want more); they are leased like running jobs, given back if they cannot start within a
    second, and at shutdown. By default the prefetch is automatic while handlers take under 50 ms
    on average (none otherwise): what the slots finish in about 0.1 s at the average run time, at
    most 512.
    ``listen=False`` is poll-only mode, for
    PgBouncer in transaction pooling; ``prepared_statements=False`` stops psycopg from preparing
    statements server-side on the worker's connections, which PgBouncer before 1.21 (or without
    ``max_prepared_statements``) cannot route in transaction pooling. :meth:`stop` (or SIGTERM or
    SIGINT under :meth:`run_sync`) stops claiming at once, lets running handlers finish for up to
    ``shutdown_timeout`` seconds, and gives back the leases of those that did not (not counted as
    a failure).
    """

    def __init__(
        self,
        jobs: Jobs,
        database_url: str,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 4,
        lease: float = 60.0,
        heartbeat: float | None = None,
        poll_interval: float = 1.0,
        shutdown_timeout: float = 30.0,
        listen: bool = True,
        keep_history: bool = False,
        reap_interval: float | None = None,
        batch_size: int | None = None,
        prefetch: int | None = None,
        name: str | None = None,
        prepared_statements: bool = True,
    ) -> None:
        if queues is None:
            queues = sorted({k.options.queue for k in jobs if k.handler is not None})
        self.config = WorkerConfig(
            queues=tuple(dict.fromkeys(queues)),
            concurrency=concurrency,
            lease=lease,
            heartbeat=heartbeat,
            poll_interval=poll_interval,
            shutdown_timeout=shutdown_timeout,
            listen=listen,
            keep_history=keep_history,
            reap_interval=reap_interval,
            batch_size=batch_size,
            prefetch=prefetch,
            name=name,
            prepared_statements=prepared_statements,
        )
        check_config(self.config, jobs)
        self.jobs = jobs
        self.conninfo = libpq_conninfo(database_url)
        # psycopg prepares a statement server-side after its 5th run; None: never.
        self._prepare_threshold: int | None = 5 if prepared_statements else None
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._sql = WorkerSQL(jobs.schema)
        # Keyed claims cost an extra transaction per round: only workers that may see keyed jobs
        # (a handled kind with a concurrency limit) run them.
        self._keyed = any(
            k.options.concurrency_limit is not None
            for k in jobs
            if k.handler is not None and k.options.queue in self.config.queues
        )
        self._steps = StepWriter(
            self.conninfo,
            self._sql.record_step,
            self._app_name("steps"),
            prepare_threshold=self._prepare_threshold,
        )
        self._lease = timedelta(seconds=lease)
        #: Running jobs: the job, its context, and the slot task running it.
        self._active: dict[int, tuple[ClaimedJob, JobContext, asyncio.Task[Any]]] = {}
        #: The automatic prefetch, resized as the average handler run time moves.
        self._auto_prefetch = 0
        #: The prefetch and the claim limit in force (read per job: attributes, not calls).
        self._prefetch_n = 0
        self._limit = 0
        self._set_prefetch()
        #: Jobs run so far (the automatic prefetch is resized every few of them).
        self._runs = 0
        #: Slot tasks alive (each runs buffered jobs one at a time; at most ``concurrency``). The
        #: set also holds the only strong references to them: the loop keeps weak ones.
        self._slot_tasks: set[asyncio.Task[None]] = set()
        self._slot_turn = 0
        #: Claimed, not started yet: they wait for a free slot (at most ``prefetch`` of them).
        self._buffer: collections.deque[ClaimedJob] = collections.deque()
        #: inspect.iscoroutinefunction per handler, computed once (it costs ~1.5 us per call).
        self._is_async: dict[Any, bool] = {}
        #: Claimed jobs that crashed a worker before, to give back: this process holds one already.
        self._give_back: list[ClaimedJob] = []
        self._buffered_at = 0.0
        self._finished_since = 0.0
        #: Moving average of handler run time (seconds); None until a job has finished.
        self._avg_runtime: float | None = None
        self._last_claim = 0.0
        self._finished: list[_Finished] = []
        self._lanes = [_Lane(i) for i in range(_LANES if concurrency > 1 else 1)]
        #: Round trips (outcomes and/or a claim) in flight, one per busy lane.
        self._in_flight = 0
        #: Jobs the claims in flight may bring: counted against the room until they are taken.
        self._reserved = 0
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drained = False
        #: Bumped by every wakeup, so a claim can tell whether one arrived while it was in flight.
        self._wakeups = 0
        #: Guards the hand-over of the claim to the listener's thread (_parked, _thread_claim).
        self._gate = threading.Lock()
        #: Set while the fetch loop sleeps with nothing held: the claim limit and the wakeup count.
        #: The listener's thread takes it (and with it the right to claim) when a NOTIFY arrives.
        self._parked: tuple[int, int] | None = None
        #: A claim by the listener's thread is in flight: the fetch loop does not claim meanwhile.
        self._thread_claim = False
        #: A wakeup from the listener's thread is on its way to the event loop (coalesces them).
        self._wake_pending = False
        self._queue_turn = 0
        self._runners: SyncRunners | None = None
        self.leases: LeaseKeeper | None = None
        self.listener: Listener | None = None
        #: Counters for tests, benchmarks and the final log line.
        self.counts = {"claimed": 0, "done": 0, "failed": 0, "dead": 0, "released": 0}
        self.started = threading.Event()

    # -- control ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming now, let running handlers finish; safe from any thread or signal handler."""
        self._stopping = True
        self._parked = None
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    def _app_name(self, role: str) -> str:
        # Shown in pg_stat_activity: which worker, and which of its connections (max 63 bytes).
        return f"sqla-jobs {role} {self.name}"[:63]

    def wake(self) -> None:
        """Make the fetch loop look for work now (what a NOTIFY does)."""
        if self._wake is not None:
            self._undrain()
            self._wake.set()

    def _undrain(self) -> None:
        self._wakeups += 1
        self._drained = False

    def run_sync(self, *, install_signal_handlers: bool = True) -> int:
        """Run until stopped; return the exit code (0 after a graceful stop).

        With ``install_signal_handlers``, the first SIGTERM or SIGINT stops gracefully and a second
        one exits the process at once with code 130 (leases then expire and are reaped).
        """
        return asyncio.run(self._main(install_signal_handlers))

    async def run(self) -> None:
        """Run in the current event loop until :meth:`stop` is called."""
        await self._main(False)

    async def _main(self, signals: bool) -> int:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        self._lanes[0].conn = await self._connect(self._lanes[0])
        self.leases = LeaseKeeper(
            conninfo=self.conninfo,
            application_name=self._app_name("leases"),
            prepare_threshold=self._prepare_threshold,
            sql=self._sql,
            lease=self._lease,
            heartbeat=self.config.heartbeat_seconds,
            reap_interval=self.config.reap_seconds,
            snapshot=self._held,
            on_lost=self._lost,
            name=self.name,
        )
        self.leases.start()
        if self.config.listen:
            self.listener = Listener(
                self.conninfo,
                self.jobs.channel,
                self.config.queues,
                self._on_notify,
                application_name=self._app_name("listen"),
                prepare_threshold=self._prepare_threshold,
            )
            self.listener.start()
        log.info(
            "worker %s started: queues=%s concurrency=%s lease=%gs listen=%s",
            self.name,
            ",".join(self.config.queues),
            self.config.concurrency,
            self.config.lease,
            self.config.listen,
            extra={"event": "started"},
        )
        self.started.set()
        try:
            await self._fetch_loops()
            # First the listener: a claim its thread has in flight is delivered before the
            # shutdown gives back what was never started.
            await self._stop_listener()
            await self._shutdown()
        finally:
            await self._stop_listener()
            self.leases.stop()
            await asyncio.to_thread(self.leases.join, 10)
            await self._close()
            if self._runners is not None:
                self._runners.close()
            self._steps.close()
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
        log.info("worker %s stopped: %s", self.name, self.counts, extra={"event": "stopped"})
        return 0

    def _on_signal(self, sig: int) -> None:
        if self._stopping:
            log.error("second %s: exiting now", signal.Signals(sig).name, extra={"event": "forced"})
            logging.shutdown()
            os._exit(EXIT_FORCED)
        log.info(
            "%s: stopping (finishing %d running jobs, up to %gs)",
            signal.Signals(sig).name,
            len(self._active),
            self.config.shutdown_timeout,
            extra={"event": "stopping"},
        )
        self.stop()

    # -- the loop ---------------------------------------------------------------------------------

    @property
    def _conn(self) -> psycopg.AsyncConnection[tuple[object, ...]] | None:
        """The first lane's connection (the one an idle worker claims on)."""
        return self._lanes[0].conn

    async def _fetch_loops(self) -> None:
        """Run every lane's fetch loop until stopped; an unexpected error in one stops them all
        (after their round trips in flight end) and is raised."""
        loops = [
            asyncio.create_task(self._fetch_loop(lane), name=f"sqla-jobs-fetch-{lane.index}")
            for lane in self._lanes
        ]
        try:
            _, pending = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:
            # Cancelled (run() was): the loops go with it, as the one loop did before lanes.
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            raise
        if pending:
            self.stop()
            await asyncio.wait(pending)
        for loop in loops:
            loop.result()

    async def _fetch_loop(self, lane: _Lane) -> None:
        assert self._wake is not None
        failures = 0
        while not self._stopping:
            self._wake.clear()
            self._start_buffered()
            try:
                progressed = await self._step(lane)
                failures = 0
            except CONNECTION_ERRORS as exc:
                failures += 1
                delay = reconnect_delay(failures)
                log.warning(
                    "database connection lost, reconnecting in %.1fs: %s",
                    delay,
                    exc,
                    extra={"event": "conn_lost"},
                )
                await self._close(lane)
                await self._sleep(delay)
                if lane.index == 0:
                    try:
                        lane.conn = await self._connect(lane)
                    except CONNECTION_ERRORS:
                        pass
                continue
            self._start_buffered()
            if progressed:
                continue
            if lane.index:
                # Only lane 0 parks, polls and keeps the timers: the others act while it is busy,
                # woken by what gives them something to do (a job's end, a wakeup, stop()). No
                # timer of their own: it would wake lane 0 too, out of its park.
                await self._sleep(_IDLE_LANE_WAIT)
                continue
            self._park()
            await self._sleep(self._wait_seconds())
            self._unpark()
            if self._drained and time.monotonic() - self._last_claim >= self.config.poll_interval:
                self._drained = False  # the polling floor

    def _room(self) -> int:
        # Jobs this worker may still take on. Finished-but-unwritten ones do not count: their
        # outcomes are written ahead of the claim, in the same round trip.
        held = len(self._active) + len(self._buffer) + self._reserved
        return self.config.concurrency + self._prefetch_n - held

    def _prefetch(self) -> int:
        return self._prefetch_n

    def _set_prefetch(self) -> None:
        config = self.config
        # Auto (see _size_prefetch): only while handlers are short. Long handlers gain nothing
        # from it, and jobs waiting behind them would only be given back (two more row versions
        # each).
        self._prefetch_n = config.prefetch if config.prefetch is not None else self._auto_prefetch
        self._limit = config.batch_size or (config.concurrency + min(_CLAIM_CAP, self._prefetch_n))

    def _size_prefetch(self, avg_runtime: float) -> None:
        # Auto: hold what the slots finish in about _PREFETCH_HORIZON, up to _PREFETCH_CAP (no-op
        # jobs get the cap: big claims, few round trips; 10 ms jobs a few per slot), so buffered
        # jobs start long before _BUFFER_MAX_WAIT would give them back.
        if avg_runtime > _SHORT_JOB:
            auto = 0
        else:
            per_slot = _PREFETCH_HORIZON / max(avg_runtime, 1e-6)
            auto = min(_PREFETCH_CAP, int(self.config.concurrency * per_slot))
        if auto != self._auto_prefetch:
            self._auto_prefetch = auto
            self._set_prefetch()

    def _claim_limit(self) -> int:
        return self._limit

    def _wait_seconds(self) -> float:
        if self._finished:
            # Outcomes wait a moment to be written together (or with the next claim).
            return max(0.0, self._finished_since + _FLUSH_DELAY - time.monotonic())
        if self._buffer:
            return max(0.0, self._buffered_at + _BUFFER_MAX_WAIT - time.monotonic())
        if self._drained:
            return max(0.0, self._last_claim + self.config.poll_interval - time.monotonic())
        return self.config.poll_interval

    async def _step(self, lane: _Lane) -> bool:
        """Write outcomes and/or claim on ``lane``, when worth a round trip; True if it claimed a
        full batch."""
        if lane.index > self._in_flight:
            return False  # the lanes before it are free: theirs to do
        room = self._room()
        want_claim = self._want_claim(room)
        stale = bool(self._buffer) and time.monotonic() - self._buffered_at > _BUFFER_MAX_WAIT
        want_flush = bool(self._finished) and (
            want_claim
            or len(self._finished) >= self._claim_limit()
            or not (self._active or self._buffer)
            or time.monotonic() - self._finished_since >= _FLUSH_DELAY
        )
        if stale:
            # Prefetched jobs that could not start in time go back to the queue for idle
            # workers, instead of waiting behind this worker's long-running handlers.
            # Taken out first: the other lane may buffer new claims while this release waits.
            stale_jobs = list(self._buffer)
            self._buffer.clear()
            try:
                await self._release(stale_jobs, lane)
            except BaseException:
                # Not given back: still this worker's (heartbeated), released on the next step.
                self._buffer.extendleft(reversed(stale_jobs))
                raise
        if not (want_claim or want_flush):
            return False
        limit = min(room, self._claim_limit()) if want_claim else 0
        wakeups = self._wakeups
        claimed = await self._write_and_claim(limit, lane)
        if want_claim:
            self._last_claim = time.monotonic()
            # Fewer than asked: the queue is empty for now. Until a NOTIFY or the poll timer says
            # otherwise, finishing jobs only flush, they do not re-claim. But a wakeup that
            # arrived while the claim was in flight may announce a job committed after the
            # claim's snapshot: it must not be erased.
            self._drained = claimed < limit and self._wakeups == wakeups
        return want_claim and not self._drained

    def _want_claim(self, room: int) -> bool:
        # Refill when the local buffer runs low, not for every slot that frees up: claims come
        # in batches, and a batch's completions ride along with the next claim.
        # Claim only while a slot is free: a worker whose slots are all busy (with long jobs,
        # say) must not take jobs it cannot start.
        # The buffer test first: it is the one that fails while a busy worker has work.
        return (
            len(self._buffer) <= self._prefetch_n // 2
            and not self._drained
            and not self._thread_claim
            and self._in_flight < len(self._lanes)
            and room > 0
            and len(self._active) < self.config.concurrency
            and (room >= self._limit // 2 or not (self._active or self._buffer or self._reserved))
        )

    def _loop_has_work(self) -> bool:
        """Whether a job's end gives the fetch loop something to do now: a first outcome to
        schedule a write for, a full batch of outcomes, an idle worker, or room to claim. Jobs
        that end otherwise do not wake it (a wakeup per job is measurable at thousands per
        second); the loop's own timers cover the rest."""
        finished = len(self._finished)
        if finished == 1 or not (self._active or self._buffer):
            return True
        return finished >= self._limit or self._want_claim(self._room())

    def _start_buffered(self) -> None:
        """Give the buffered jobs to free slots. A slot is a task that runs buffered jobs one after
        another until the buffer is empty: one task per slot rather than per job, because creating
        and scheduling a task costs more than running a short job."""
        idle = min(self.config.concurrency - len(self._slot_tasks), len(self._buffer))
        if self._stopping or idle <= 0:
            return
        for _ in range(idle):
            self._slot_turn += 1
            task = asyncio.create_task(self._slot(), name=f"sqla-jobs-slot-{self._slot_turn}")
            self._slot_tasks.add(task)

    async def _slot(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        wake = self._wake
        assert wake is not None
        ran = 0
        try:
            while self._buffer and not self._stopping:
                job = self._buffer.popleft()
                self._buffered_at = time.monotonic()
                self._start(job, task)
                await self._run_job(job, self._active[job.id][1])
                ran += 1
                # Handlers that never await would hold the event loop for the whole buffer: yield
                # when the fetch loop has work (a claim or a write to send) and is not already
                # waiting for a round trip, and every few jobs (which also lets a round trip's
                # result in). Not after every job: each yield is a turn of the event loop.
                if (
                    wake.is_set() and self._in_flight < len(self._lanes)
                ) or ran % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        finally:
            self._slot_tasks.discard(task)

    async def _release(self, jobs: list[ClaimedJob], lane: _Lane | None = None) -> None:
        """Give claimed jobs back (on ``lane``, default the first): pending again, the claim's
        attempt undone, not a failure."""
        if not jobs:
            return
        conn = await self._db(lane or self._lanes[0])
        cur = await conn.execute(
            self._sql.release.sql,
            self._sql.release.params(
                ids=[j.id for j in jobs], tokens=list({j.lease_token for j in jobs})
            ),
        )
        released = len(await cur.fetchall())
        self.counts["released"] += released
        log.info(
            "released %d claimed jobs back to the queue",
            released,
            extra={"event": "released"},
        )

    async def _sleep(self, seconds: float) -> None:
        """Until woken or ``seconds`` pass: the timer sets the wake event itself (cheaper than
        ``wait_for``, which wraps the wait in a task; the loop clears the event on each turn)."""
        wake = self._wake
        assert wake is not None
        if wake.is_set():
            return
        timer = asyncio.get_running_loop().call_later(seconds, wake.set)
        try:
            await wake.wait()
        finally:
            timer.cancel()

    # -- the listener's thread -------------------------------------------------------------------

    def _park(self) -> None:
        """Before the fetch loop sleeps: if the worker holds nothing and the queue looked empty,
        hand the next claim to the listener's thread, which makes it the moment a NOTIFY arrives
        (two hops through the event loop fewer: the difference between an idle worker's pickup in
        about the baseline's time and in twice it)."""
        if (
            self.listener is None
            or self._stopping
            or not self._drained
            or self._thread_claim
            or self._in_flight
            or self._active
            or self._buffer
            or self._finished
            or self._give_back
        ):
            return
        limit = min(self._room(), self._claim_limit())
        if limit > 0:
            with self._gate:
                self._parked = (limit, self._wakeups)

    def _unpark(self) -> None:
        if self._parked is not None:
            with self._gate:
                self._parked = None

    def _on_notify(self, conn: ListenConnection, queues: list[str]) -> None:
        """In the listener's thread, for each batch of notifications (``queues`` empty after a
        (re)connect): claim on its connection if the fetch loop is parked, else wake the loop."""
        parked = None
        if queues:
            with self._gate:
                if self._parked is not None and not self._stopping:
                    parked, self._parked = self._parked, None
                    self._thread_claim = True
        if parked is None:
            self._wake_from_thread()
            return
        limit, wakeups = parked
        rows: list[Any] | None = None
        try:
            # The worker holds nothing: no crashed job either, so crashed ones may come (_take
            # keeps at most one).
            rows = conn.execute(
                self._sql.claim.sql,
                self._claim_params(queues[0], limit, crashed_ok=True),
            ).fetchall()
        finally:
            # Even when it failed (the listener then reconnects): the loop must claim again.
            self._call_soon(self._deliver, rows, limit, wakeups, len(queues) > 1)

    def _deliver(self, rows: list[Any] | None, limit: int, wakeups: int, more: bool) -> None:
        """On the event loop: take what the listener's thread claimed, and start it at once."""
        self._thread_claim = False
        if rows is None:
            self.wake()
            return
        self._last_claim = time.monotonic()
        self.counts["claimed"] += self._take(rows)
        # As after the fetch loop's own claim: fewer than asked means the queue is empty for now,
        # unless a wakeup came since the park, other queues were notified too, or the loop has its
        # own claims to make (keyed jobs, jobs to give back).
        self._drained = (
            len(rows) < limit
            and self._wakeups == wakeups
            and not (more or self._keyed or self._give_back)
        )
        self._start_buffered()
        if self._wake is not None:
            self._wake.set()

    def _wake_from_thread(self) -> None:
        # One wakeup on its way at a time: a notification that finds one pending is covered by it
        # (the loop counts the wakeup when it runs, after the notification arrived).
        if not self._wake_pending:
            self._wake_pending = True
            self._call_soon(self._woken)

    def _woken(self) -> None:
        self._wake_pending = False
        self.wake()

    def _call_soon(self, callback: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop has closed: the worker is gone, leases expire and are reaped

    async def _stop_listener(self) -> None:
        listener = self.listener
        if listener is not None and listener.is_alive():
            listener.stop()
            await asyncio.to_thread(listener.join, 10)

    async def _connect(self, lane: _Lane) -> psycopg.AsyncConnection[tuple[object, ...]]:
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo,
            **KEEPALIVES,
            autocommit=True,
            connect_timeout=10,
            application_name=self._app_name(f"claim{lane.index + 1}" if lane.index else "claim"),
            prepare_threshold=self._prepare_threshold,
        )
        # Claimed payloads (and steps) arrive as jsonb text, decoded by pydantic in _run_job: a
        # payload Python's json module cannot decode (nested past the recursion limit) must kill
        # its job, not the fetch loop and the whole claimed batch with it.
        conn.adapters.register_loader("jsonb", TextLoader)
        return conn

    async def _close(self, lane: _Lane | None = None) -> None:
        """Close ``lane``'s connection (default: every lane's)."""
        for each in [lane] if lane is not None else self._lanes:
            conn, each.conn = each.conn, None
            await aclose_quietly(conn)

    async def _db(self, lane: _Lane) -> psycopg.AsyncConnection[tuple[object, ...]]:
        if lane.conn is None or lane.conn.closed:
            lane.conn = await self._connect(lane)
        return lane.conn

    async def _write_and_claim(self, limit: int, lane: _Lane | None = None) -> int:
        """Write the finished jobs' outcomes and claim up to ``limit`` jobs on ``lane`` (default
        the first), in one round trip (a psycopg pipeline: each statement still commits on its
        own)."""
        lane = lane or self._lanes[0]
        self._in_flight += 1
        self._reserved += limit
        try:
            return await self._round_trip(limit, lane)
        finally:
            self._in_flight -= 1
            self._reserved -= limit

    async def _round_trip(self, limit: int, lane: _Lane) -> int:
        queues = self.config.queues
        first = queues[self._queue_turn % len(queues)]
        self._queue_turn += 1
        batch, self._finished = self._finished, []
        lane.writing = batch
        try:
            # Inside the try: a reconnect that fails must not drop the outcomes it was to write.
            conn = await self._db(lane)
            if batch:
                async with conn.pipeline():
                    done, done_cur, fail_curs, claim_cur = await self._send(
                        conn, batch, first, limit
                    )
            else:
                # Nothing to write (an idle worker woken by a NOTIFY): a lone claim, without the
                # pipeline's setup and Sync, picks the job up sooner.
                done, done_cur, fail_curs, claim_cur = await self._send(conn, batch, first, limit)
        except BaseException:
            # Not known to be written: keep them for the next try (the writes are fenced, so
            # writing one twice changes nothing).
            self._finished = batch + self._finished
            raise
        finally:
            lane.writing = []
        if done_cur is not None:
            self._count_done(len(done), len(await done_cur.fetchall()))
        for f, cur in fail_curs:
            self._log_failure(f, await cur.fetchone())
        claimed = 0
        if claim_cur is not None:
            claimed = self._take(await claim_cur.fetchall())
        # Other queues (in turn) and keyed jobs, when the first queue did not fill the batch.
        for queue in queues:
            if claimed >= limit:
                break
            if queue != first:
                cur = await conn.execute(
                    self._sql.claim.sql,
                    self._claim_params(queue, limit - claimed),
                )
                claimed += self._take(await cur.fetchall())
        if self._keyed:
            for queue in queues:
                if claimed >= limit:
                    break
                claimed += await self._claim_keyed(conn, queue, limit - claimed)
        self.counts["claimed"] += claimed
        lane.claimed += claimed
        if self._give_back:
            give_back, self._give_back = self._give_back, []
            try:
                await self._release(give_back, lane)
            except BaseException:
                self._give_back = give_back + self._give_back
                raise
        return claimed

    async def _send(
        self,
        conn: psycopg.AsyncConnection[tuple[object, ...]],
        batch: list[_Finished],
        queue: str,
        limit: int,
    ) -> tuple[
        list[ClaimedJob],
        psycopg.AsyncCursor[tuple[object, ...]] | None,
        list[tuple[_Finished, psycopg.AsyncCursor[tuple[object, ...]]]],
        psycopg.AsyncCursor[tuple[object, ...]] | None,
    ]:
        """Send the outcomes' writes and the claim; returns the completed jobs and the cursors to
        read (in a pipeline, nothing is read until it ends)."""
        done_cur = None
        done = [f.job for f in batch if f.error is None]
        if done:
            stmt = (
                self._sql.complete_into_history if self.config.keep_history else self._sql.complete
            )
            done_cur = await conn.execute(
                stmt.sql,
                stmt.params(
                    ids=_pg_array([j.id for j in done]),
                    tokens=_pg_array(list({j.lease_token for j in done})),
                ),
            )
        fail_curs = [
            (f, await conn.execute(self._sql.fail.sql, self._fail_params(f)))
            for f in batch
            if f.error is not None
        ]
        claim_cur = None
        if limit:
            claim_cur = await conn.execute(
                self._sql.claim.sql,
                self._claim_params(queue, limit),
            )
        return done, done_cur, fail_curs, claim_cur

    def _claim_params(
        self, queue: str, limit: int, crashed_ok: bool | None = None
    ) -> dict[str, Any]:
        """The claim's parameters; jobs that crashed a worker before come only to a worker that
        holds none (``crashed_ok`` unless given)."""
        if crashed_ok is None:
            crashed_ok = not self._holds_a_crashed_job()
        return self._sql.claim.params(
            queue=queue, limit=limit, lease=self._lease, worker=self.name, crashed_ok=crashed_ok
        )

    def _holds_a_crashed_job(self) -> bool:
        return any(job.crashes > 0 for job, _, _ in list(self._active.values())) or any(
            job.crashes > 0 for job in self._buffer
        )

    def _take(self, rows: list[Any]) -> int:
        """Buffer the claimed jobs; the number buffered.

        A job that crashed a worker before (``crashes > 0``) is never held by a process that holds
        another one: it is given back instead. A poison job takes down every job its process
        holds, and the reaper returns them all to the queue together; claimed together again,
        the healthy ones would crash with it every time and go dead with it. Kept apart, a job is
        crashed by a given poison job at most once (on the poison job's first run).
        """
        if rows and not self._buffer:
            self._buffered_at = time.monotonic()
        taken = 0
        for row in rows:
            job = ClaimedJob._make(row)
            if job.crashes > 0 and self._holds_a_crashed_job():
                self._give_back.append(job)
            else:
                self._buffer.append(job)
                taken += 1
        return taken

    def _count_done(self, sent: int, written: int) -> None:
        self.counts["done"] += written
        if written < sent:
            log.warning(
                "%d completions refused by the lease fence (leases lost; the jobs belong "
                "to other workers now)",
                sent - written,
                extra={"event": "lease_lost"},
            )

    async def _claim_keyed(
        self, conn: psycopg.AsyncConnection[tuple[object, ...]], queue: str, limit: int
    ) -> int:
        # Two statements in one transaction: the keys' advisory locks are granted by the first, so
        # the second's snapshot sees every claim their previous holders committed.
        async with conn.transaction():
            cur = await conn.execute(
                self._sql.lock_keys.sql, self._sql.lock_keys.params(queue=queue, scan=limit)
            )
            keys = [row[0] for row in await cur.fetchall()]
            if not keys:
                return 0
            cur = await conn.execute(
                self._sql.claim_keyed.sql,
                self._sql.claim_keyed.params(
                    queue=queue, keys=keys, limit=limit, lease=self._lease, worker=self.name
                ),
            )
            rows = await cur.fetchall()
        return self._take(rows)

    def _start(self, job: ClaimedJob, task: asyncio.Task[Any]) -> None:
        ctx = JobContext.for_job(job, self.name, self._steps)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "claimed job %s (%s)",
                job.id,
                job.kind,
                extra={"event": "claimed", "job_id": job.id},
            )
        self._active[job.id] = (job, ctx, task)

    async def _run_job(self, job: ClaimedJob, ctx: JobContext) -> None:
        outcome = _Finished(job)
        started = time.monotonic()
        # Task.cancelled() only turns true once the task has finished, never inside it.
        cancelled = False
        try:
            kind = self.jobs.get(job.kind)
            if kind is None or kind.handler is None:
                outcome.error = (
                    f"unknown kind {job.kind!r}: this worker has no handler for it "
                    "(is a deploy in progress?)"
                )
                return
            outcome.backoff = kind.options.backoff
            try:
                args = load_payload(kind.model, job.payload)
            except ValidationError as exc:
                outcome.error = (
                    f"payload no longer validates against {kind.model.__qualname__}: "
                    + describe_errors(exc)
                )
                outcome.dead = True
                return
            await self._call(kind, args, ctx)
        except asyncio.CancelledError:
            # Cancelled at the shutdown timeout: no outcome to write; _shutdown releases the job.
            cancelled = True
            raise
        except HandlerTimeout as exc:
            outcome.error = str(exc)
        except Exception as exc:
            outcome.error = _describe(exc)
        finally:
            runtime = time.monotonic() - started
            avg = self._avg_runtime
            self._avg_runtime = avg = runtime if avg is None else 0.9 * avg + 0.1 * runtime
            self._runs += 1
            if self._runs < 8 or not self._runs % 8:
                self._size_prefetch(avg)
            if not cancelled:
                if not self._finished:
                    self._finished_since = time.monotonic()
                self._finished.append(outcome)
            self._active.pop(job.id, None)
            if job.concurrency_key is not None:
                # Its key has room again: look for the key's next job without waiting for a poll.
                self._undrain()
            if self._wake is not None and (self._stopping or self._loop_has_work()):
                self._wake.set()

    async def _call(self, kind: Kind, args: Any, ctx: JobContext) -> None:
        handler = kind.handler
        assert handler is not None
        is_async = self._is_async.get(handler)
        if is_async is None:
            is_async = self._is_async[handler] = inspect.iscoroutinefunction(handler)
        if is_async:
            call: Any = handler(args, ctx)
        else:
            if self._runners is None:
                self._runners = SyncRunners(
                    asyncio.get_running_loop(), self.config.concurrency, "sqla-jobs-handler"
                )
            call = self._runners.submit(handler, args, ctx)
        if kind.options.timeout is not None:
            try:
                result = await asyncio.wait_for(call, kind.options.timeout)
            except TimeoutError:
                if self._runners is not None and not is_async:
                    # The thread cannot be stopped: give the worker a runner in its place.
                    self._runners.replace_stuck()
                raise HandlerTimeout(f"timed out after {kind.options.timeout:g}s") from None
        else:
            result = await call
        if result is not None and inspect.isawaitable(result):
            await result

    async def _flush(self) -> None:
        """Write every finished job's outcome now (one round trip)."""
        if self._finished:
            await self._write_and_claim(0)

    def _fail_params(self, f: _Finished) -> dict[str, Any]:
        return self._sql.fail.params(
            id=f.job.id,
            token=f.job.lease_token,
            error=f.error,
            force_dead=f.dead,
            **f.backoff.sql_params(),
        )

    def _log_failure(self, f: _Finished, row: Any) -> None:
        if row is None:
            log.warning(
                "job %s: lease lost before its failure was recorded",
                f.job.id,
                extra={"event": "lease_lost", "job_id": f.job.id},
            )
            return
        state, run_at = row[0], row[1]
        if state == "dead":
            self.counts["dead"] += 1
            log.error(
                "job %s (%s) dead after attempt %s: %s",
                f.job.id,
                f.job.kind,
                f.job.attempts,
                f.error,
                extra={"event": "dead", "job_id": f.job.id, "kind": f.job.kind},
            )
        else:
            self.counts["failed"] += 1
            log.warning(
                "job %s (%s) failed attempt %s, retry at %s: %s",
                f.job.id,
                f.job.kind,
                f.job.attempts,
                run_at,
                f.error,
                extra={"event": "failed", "job_id": f.job.id, "kind": f.job.kind},
            )

    # -- leases ---------------------------------------------------------------------------------

    def _held(self) -> dict[int, uuid.UUID]:
        # Called from the lease thread: copy, the dict changes under the event loop.
        held = {job_id: entry[0].lease_token for job_id, entry in list(self._active.items())}
        held.update((j.id, j.lease_token) for j in [*self._buffer, *self._give_back])
        writing = [f for lane in self._lanes for f in lane.writing]
        held.update((f.job.id, f.job.lease_token) for f in [*writing, *self._finished])
        return held

    def _lost(self, ids: set[int]) -> None:
        for job_id in ids:
            entry = self._active.get(job_id)
            if entry is not None:
                entry[1].lease_lost.set()
                log.warning(
                    "job %s: lease lost (expired and reaped); its result will be discarded",
                    job_id,
                    extra={"event": "lease_lost", "job_id": job_id},
                )

    # -- shutdown -------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        # Claimed but never started: straight back to the queue for another worker, before
        # waiting for the running handlers.
        unstarted = [*self._buffer, *self._give_back]
        self._buffer.clear()
        self._give_back = []
        try:
            await self._release(unstarted)
            unstarted = []
        except CONNECTION_ERRORS:
            pass  # retried below with the rest
        tasks = [entry[2] for entry in self._active.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.config.shutdown_timeout)
        running = list(self._active.values())
        for _, _, task in running:
            task.cancel()
        if running:
            await asyncio.gather(*(t for _, _, t in running), return_exceptions=True)
        leftover = unstarted + [job for job, _, _ in running]
        for attempt in range(3):
            try:
                await self._flush()
                await self._release(leftover)
                return
            except CONNECTION_ERRORS as exc:
                log.warning(
                    "shutdown write failed (%s), retrying", exc, extra={"event": "conn_lost"}
                )
                await self._close()
                await asyncio.sleep(0.2 * (attempt + 1))
        log.error(
            "could not record outcomes at shutdown; their leases will expire and be reaped",
            extra={"event": "shutdown_incomplete"},
        )
