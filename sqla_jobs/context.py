"""What a handler sees of its job: :class:`JobContext`, and durable steps (``ctx.step``).

The worker builds one per claimed job (:meth:`JobContext.for_job`); ``sqla_jobs.testing`` builds
them too, so handlers behave the same under test.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, NoReturn, TypeVar

from .errors import JobCancelledError, LeaseLostError, StepError


class ClaimedJob(NamedTuple):
    """A job this worker holds a lease on: a claimed row, field for field (a named tuple, because
    the worker builds one per job and a tuple builds several times faster than a frozen
    dataclass)."""

    id: int
    queue: str
    kind: str
    #: The jsonb text as the worker fetches it (decoded only by pydantic), or its decoded value.
    payload: str | dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    crashes: int
    max_crashes: int
    interruptions: int
    lease_token: uuid.UUID
    created_at: datetime
    concurrency_key: str | None
    steps: str | dict[str, Any] | None


_LAZY_LOCK = threading.Lock()


class Snooze(Exception):
    """Raised by a handler (or :meth:`JobContext.snooze`): run the job again after ``delay``.

    The job goes back to ``pending`` at the database's ``now() + delay``; the run counts neither
    as a failure nor as a crash (its attempt is undone).
    """

    def __init__(self, delay: timedelta | float) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if not seconds >= 0:
            raise ValueError(f"a snooze needs a delay >= 0, got {delay!r}")
        super().__init__(f"snoozed for {seconds:g}s")
        self.delay = timedelta(seconds=seconds)


class Discard(Exception):
    """Raised by a handler: the job is ``dead`` at once, with ``reason`` in ``last_error``,
    without spending its retries on an error that cannot heal."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: Records a durable step: (job id, lease token, step name, JSON text) -> lease still held?
Recorder = Callable[[int, uuid.UUID, str, str], bool]
T = TypeVar("T")


@dataclass
class JobContext:
    """What a handler knows about the job it runs.

    ``attempt`` is 1 on the first run. :attr:`rerun` (``attempt`` above 1, ``crashes`` above 0, or
    ``interruptions`` above 0) means the job ran before, possibly to completion of its side
    effects: handlers must be idempotent. ``interruptions`` counts runs stopped at a worker's
    shutdown and given back (they spend neither budget). ``deadline`` is when the kind's timeout
    runs out, as a :func:`time.monotonic` value (None without a timeout): sync handlers, which
    cannot be interrupted, should check it between steps of long work.
    ``lease_lost`` is set if the worker learns that another worker may now own the job; anything
    the handler still writes through sqla-jobs is then rejected by the lease fence.
    """

    job_id: int
    kind: str
    queue: str
    attempt: int
    crashes: int
    max_attempts: int
    created_at: datetime
    worker: str
    _lease_lost: threading.Event | None = field(default=None, init=False, repr=False)
    _cancelled: threading.Event | None = field(default=None, init=False, repr=False)
    #: Results of the durable steps recorded by earlier runs of this job, by name (JSON form).
    steps: dict[str, Any] = field(default_factory=dict)
    lease_token: uuid.UUID | None = field(default=None, repr=False)
    recorder: Recorder | None = field(default=None, repr=False)
    interruptions: int = 0
    deadline: float | None = None

    @property
    def rerun(self) -> bool:
        """Whether an earlier run of this job may have done some of its work already."""
        return self.attempt > 1 or self.crashes > 0 or self.interruptions > 0

    def time_left(self) -> float | None:
        """Seconds until :attr:`deadline` (negative once past it); None without a timeout."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    @property
    def lease_lost(self) -> threading.Event:
        """Set if another worker may own the job now. Created on first use: a ``threading.Event``
        (a Condition and a lock) per job cost about 2 us, and almost no job ever asks."""
        event = self._lease_lost
        if event is None:
            # The lease thread sets it while the handler may be waiting on it: create it once.
            with _LAZY_LOCK:
                if self._lease_lost is None:
                    self._lease_lost = threading.Event()
                event = self._lease_lost
        return event

    @property
    def cancelled(self) -> threading.Event:
        """Set when an operator asked to cancel this job (``Jobs.cancel``). An ``async`` handler
        is cancelled at once; a sync handler should check this and stop (raising anything, or
        :class:`~sqla_jobs.JobCancelledError`): the run then ends ``cancelled``, never retried. A
        handler that returns normally anyway completes. :meth:`step` refuses to start a step."""
        event = self._cancelled
        if event is None:
            with _LAZY_LOCK:
                if self._cancelled is None:
                    self._cancelled = threading.Event()
                event = self._cancelled
        return event

    def snooze(self, delay: timedelta | float) -> NoReturn:
        """Stop this run and run the job again after ``delay`` (see :class:`Snooze`)."""
        raise Snooze(delay)

    @classmethod
    def for_job(
        cls,
        job: ClaimedJob,
        worker: str,
        recorder: Recorder | None,
        timeout: float | None = None,
    ) -> JobContext:
        """The context of a job just claimed by ``worker``, starting now (``timeout``: the kind's,
        in seconds)."""
        steps = json.loads(job.steps) if isinstance(job.steps, str) else job.steps
        return cls(
            job_id=job.id,
            kind=job.kind,
            queue=job.queue,
            attempt=job.attempts,
            crashes=job.crashes,
            max_attempts=job.max_attempts,
            created_at=job.created_at,
            worker=worker,
            steps=dict(steps or {}),
            lease_token=job.lease_token,
            recorder=recorder,
            interruptions=job.interruptions,
            deadline=None if timeout is None else time.monotonic() + timeout,
        )

    def step(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once for this job and record its JSON-serializable result.

        If an earlier run of the job recorded step ``name``, return that result (in its JSON form:
        tuples come back as lists) without calling ``fn``. The record is written in its own short
        transaction, fenced on the lease: :class:`LeaseLostError` if another worker owns the job
        now. Not exactly-once: if the process dies after ``fn``'s side effect and before the
        record, ``fn`` runs again on the retry.
        """
        if name in self.steps:
            return typing.cast(T, self.steps[name])
        self._refuse_if_cancelled(name)
        result = fn(*args, **kwargs)
        self._record(name, result)
        return result

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`step` for async code: ``fn`` may be a coroutine function; the record is written
        from a thread so the event loop is not blocked."""
        if name in self.steps:
            return self.steps[name]
        self._refuse_if_cancelled(name)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        await asyncio.to_thread(self._record, name, result)
        return result

    def _refuse_if_cancelled(self, name: str) -> None:
        if self._cancelled is not None and self._cancelled.is_set():
            raise JobCancelledError(f"job {self.job_id} was cancelled: step {name!r} not started")

    def _record(self, name: str, result: Any) -> None:
        if not isinstance(name, str) or not name:
            raise StepError(f"step names must be non-empty strings, got {name!r}")
        try:
            value = json.dumps(result)
        except (TypeError, ValueError) as exc:
            raise StepError(f"result of step {name!r} is not JSON-serializable: {exc}") from None
        if self.recorder is None or self.lease_token is None:
            raise StepError("durable steps need a context created by a worker")
        if not self.recorder(self.job_id, self.lease_token, name, value):
            self.lease_lost.set()
            raise LeaseLostError(
                f"job {self.job_id}: lease lost, step {name!r} was not recorded; another worker "
                "may own the job now"
            )
        self.steps[name] = json.loads(value)
