"""What a worker holds: every job it has a lease on, from its claim to its written outcome.

Leases are (id, lease token) pairs, never ids alone: after a lost lease a process can claim a job
it is still running (the old run's handler cannot be stopped), and the two claims must not be
confused. The new claim waits in :attr:`Holdings.deferred` until the old run ends, so one process
never runs two instances of one job, and running jobs can be keyed by id.

Owned by the event loop. The lease thread only reads it, through :meth:`Holdings.snapshot`
(copies made by single C-level calls, safe under the GIL while the loop changes the
collections), and reports lost leases back through the loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sqla_jobs._outcome import Outcome
from sqla_jobs.context import ClaimedJob, JobContext, row_maker

log = logging.getLogger("sqla_jobs.worker")

Held = tuple[int, uuid.UUID]


#: A job whose handler runs now, its context, and the slot task running it (a plain tuple: one is
#: built per job run).
Running = tuple[ClaimedJob, JobContext, "asyncio.Task[Any] | None"]


def _last_life(job: ClaimedJob) -> bool:
    return job.crashes + 1 >= job.max_crashes


class Holdings:
    """The jobs of one worker, by stage: buffered (claimed, waiting for a slot), deferred (claimed
    again while an older run of the same job still runs here), running, finished (outcome not yet
    written), writing (outcome in a round trip, per lane), and to give back (claimed against the
    crash rule)."""

    def __init__(self) -> None:
        self.running: dict[int, Running] = {}
        #: Ids of running jobs whose sync handler is stuck far past its timeout: its thread
        #: cannot be stopped, so the job is never given back (it is reaped once the process
        #: exits).
        self.stuck: set[int] = set()
        #: Ids of running jobs an operator asked to cancel (their handlers were told).
        self.cancelling: set[int] = set()
        self.buffer: collections.deque[ClaimedJob] = collections.deque()
        self.deferred: list[ClaimedJob] = []
        self.finished: list[Outcome] = []
        self.writing: dict[int, list[Outcome]] = {}
        self.give_back: list[ClaimedJob] = []
        #: Jobs the claims in flight may bring: counted against the room until they are taken.
        self.reserved = 0
        #: Held jobs that crashed a worker before, and those of them on their last crash life.
        self.crashed = 0
        self.last_life = 0
        #: When the oldest buffered job was buffered, and the oldest unwritten outcome finished.
        self.buffered_at = 0.0
        self.finished_since = 0.0
        #: The claims return each job's meta too (``WorkerSQL.meta``): rows one column wider.
        self.meta = False
        #: The claims return each job's due_at last (``WorkerSQL.timed``, metrics on).
        self.timed = False
        self._make = row_maker(False, False)

    def set_columns(self, *, meta: bool, timed: bool) -> None:
        """Say what the claims return beyond :class:`ClaimedJob`'s fields (see :attr:`meta`,
        :attr:`timed`)."""
        self.meta, self.timed = meta, timed
        self._make = row_maker(meta, timed)

    # -- counting ---------------------------------------------------------------------------------

    def room(self, concurrency: int, prefetch: int) -> int:
        """How many more jobs the worker may take on. Finished-but-unwritten ones do not count:
        their outcomes are written ahead of the next claim, in the same round trip."""
        held = len(self.running) + len(self.buffer) + len(self.deferred) + self.reserved
        return concurrency + prefetch - held

    def busy(self) -> bool:
        """Whether any job is running or waiting for a slot."""
        return bool(self.running or self.buffer or self.deferred)

    def crash_params(self) -> dict[str, bool]:
        """The claim's crash rule for what is held now (see ``sqla_jobs.sql.scans.crash_rule``)."""
        return {"crashed_ok": not self.last_life, "last_life_ok": not self.crashed}

    def _count(self, job: ClaimedJob, sign: int) -> None:
        if job.crashes:
            self.crashed += sign
            if _last_life(job):
                self.last_life += sign

    # -- moving jobs ------------------------------------------------------------------------------

    def take(self, rows: Iterable[Any], now: float) -> int:
        """Hold the claimed ``rows``; the number buffered or deferred. A crashed job the crash
        rule forbids next to what is held already goes to :attr:`give_back`."""
        if not self.buffer:
            self.buffered_at = now
        taken = 0
        make = self._make
        for row in rows:
            job = make(row)
            if job.crashes and (self.crashed if _last_life(job) else self.last_life):
                self.give_back.append(job)
                continue
            if job.crashes:
                self._count(job, 1)
            if job.id in self.running:
                self.deferred.append(job)
            else:
                self.buffer.append(job)
            taken += 1
        return taken

    def defer(self, job: ClaimedJob) -> None:
        """Hold ``job`` back until the run of the same job here ends (a slot found it in the
        buffer while that run still runs). Slots start jobs by putting them in :attr:`running`
        themselves: one dict store per job, on the hot path."""
        self.deferred.append(job)

    def end(self, job: ClaimedJob, outcome: Outcome | None, now: float) -> None:
        """``job``'s handler is done; ``outcome`` None: nothing to write (cancelled at shutdown,
        to be given back). A claim of the same job deferred behind it may start now."""
        del self.running[job.id]
        if job.crashes:
            self._count(job, -1)
        if self.stuck:
            self.stuck.discard(job.id)
        if self.cancelling:
            self.cancelling.discard(job.id)
        if outcome is not None:
            # finish(), inline: once per job.
            if not self.finished:
                self.finished_since = now
            self.finished.append(outcome)
        if self.deferred:
            ready = [j for j in self.deferred if j.id == job.id]
            if ready:
                # One at a time: the next claim of this job waits for this one's run.
                self.deferred.remove(ready[0])
                self.buffer.appendleft(ready[0])

    def finish(self, outcome: Outcome, now: float) -> None:
        """An outcome to write with the next round trip."""
        if not self.finished:
            self.finished_since = now
        self.finished.append(outcome)

    def cancel_unstarted(self, ids: Iterable[int]) -> list[ClaimedJob]:
        """The buffered and deferred jobs among ``ids``, out of the holdings: cancelled before
        they started (their outcome still has to be written under their lease)."""
        wanted = set(ids)
        found = [j for j in [*self.buffer, *self.deferred] if j.id in wanted]
        if found:
            gone = {(j.id, j.lease_token) for j in found}
            self._keep_buffered(lambda j: (j.id, j.lease_token) not in gone)
            self.deferred = [j for j in self.deferred if (j.id, j.lease_token) not in gone]
            for job in found:
                self._count(job, -1)
        return found

    def _keep_buffered(self, keep: Callable[[ClaimedJob], bool]) -> None:
        # In place: the slots hold a reference to the deque.
        kept = [j for j in self.buffer if keep(j)]
        self.buffer.clear()
        self.buffer.extend(kept)

    def take_buffer(self) -> list[ClaimedJob]:
        """Every buffered job, out of the buffer (to be given back)."""
        jobs = list(self.buffer)
        self.buffer.clear()
        for job in jobs:
            self._count(job, -1)
        return jobs

    def restore_buffer(self, jobs: list[ClaimedJob]) -> None:
        """Put back jobs :meth:`take_buffer` took, at the front, when giving them back failed."""
        for job in jobs:
            self._count(job, 1)
        self.buffer.extendleft(reversed(jobs))

    def unstarted(self) -> list[ClaimedJob]:
        """Everything claimed and never started, out of the holdings (shutdown gives it back)."""
        jobs = [*self.take_buffer(), *self.deferred, *self.give_back]
        for job in self.deferred:
            self._count(job, -1)
        self.deferred, self.give_back = [], []
        return jobs

    # -- the lease thread's view ------------------------------------------------------------------

    def snapshot(self) -> list[Held]:
        """Every (id, token) this worker holds a lease on. Called from the lease thread."""
        held = [(r[0].id, r[0].lease_token) for r in list(self.running.values())]
        held += [(j.id, j.lease_token) for j in [*self.buffer, *self.deferred, *self.give_back]]
        outcomes = [*self.finished, *(o for batch in list(self.writing.values()) for o in batch)]
        held += [(o.job.id, o.job.lease_token) for o in outcomes]
        return held

    def lost(self, held: set[Held]) -> None:
        """Leases that expired and were reaped: another worker may own these jobs now. Running
        handlers are told (``ctx.lease_lost``); jobs not started are dropped, never run."""
        for key in held:
            running = self.running.get(key[0])
            if running is not None and running[0].lease_token == key[1]:
                running[1].lease_lost.set()
                if running[1].in_session:
                    # Its row may be gone because its own transaction completed it: the fenced
                    # completion in that transaction is the one to tell (and log) a real loss.
                    continue
                log.warning(
                    "job %s: lease lost (expired and reaped); its result will be discarded",
                    key[0],
                    extra={"event": "lease_lost", "job_id": key[0]},
                )
        dropped = [j for j in self.buffer if (j.id, j.lease_token) in held]
        if dropped:
            for job in dropped:
                self._count(job, -1)
            self._keep_buffered(lambda j: (j.id, j.lease_token) not in held)
        deferred = [j for j in self.deferred if (j.id, j.lease_token) in held]
        for job in deferred:
            self._count(job, -1)
        self.deferred = [j for j in self.deferred if (j.id, j.lease_token) not in held]
        self.give_back = [j for j in self.give_back if (j.id, j.lease_token) not in held]
