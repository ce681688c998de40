"""What a handler sees of its job: :class:`JobContext`, and durable steps (``ctx.step``).

The worker builds one per claimed job (:meth:`JobContext.for_job`); ``sqla_jobs.testing`` builds
them too, so handlers behave the same under test.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import time
import typing
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple, NoReturn, TypeVar

from sqla_jobs.errors import ConfigurationError, JobCancelledError, LeaseLostError, StepError


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
    #: When the job was created, in microseconds since the epoch (``JobContext.created_at``).
    created_us: int
    concurrency_key: str | None
    steps: str | dict[str, Any] | None


class ClaimedWithMeta(ClaimedJob):
    """A claimed job and its meta: a row of a claim that returns the ``meta`` column too, as its
    element after :class:`ClaimedJob`'s fields (``sqla_jobs.sql.claim.claim_with_meta``).

    A subclass rather than a field of ClaimedJob with a default: a worker without a middleware
    that reads meta builds its jobs from the plain claim's rows exactly as before, with no column,
    copy or default more per job.
    """

    __slots__ = ()

    @property
    def meta(self) -> str | dict[str, Any] | None:
        """The job's meta, as the claim returned it: JSON text (the worker fetches jsonb as text),
        a decoded dict, or None for a job without meta."""
        return typing.cast("str | dict[str, Any] | None", tuple.__getitem__(self, _META_AT))


class ClaimedWithDue(ClaimedJob):
    """A claimed job and when it became due: a row of a claim that returns ``due_at`` too, as its
    last element (``sqla_jobs.sql.claim.claim_with_due_at``: the claim of a worker with metrics). With
    the meta as well, the row is a :class:`ClaimedWithMeta` whose last element is ``due_at``.
    Read it with :func:`due_at`."""

    __slots__ = ()


def due_at(job: ClaimedJob) -> float:
    """When ``job`` became due (its ``run_at``), as a :func:`time.monotonic` value of this
    process: the last element of a row claimed with ``due_at`` (a :class:`ClaimedWithDue`, or a
    :class:`ClaimedWithMeta` of such a claim). The claim computes it from the database's clock,
    so the pickup delay is ``time.monotonic() - due_at(job)`` when the handler starts. (The row
    holds it as integer microseconds.)"""
    return typing.cast(int, tuple.__getitem__(job, -1)) * 1e-6


def row_maker(meta: bool, timed: bool) -> Callable[[Sequence[Any]], ClaimedJob]:
    """What builds a claimed job from one row of a claim that returns ``meta`` and ``due_at`` as
    said: ``tuple.__new__`` bound to the class, called once per claimed job without a Python
    frame of its own."""
    cls = ClaimedWithMeta if meta else ClaimedWithDue if timed else ClaimedJob
    return typing.cast(
        "Callable[[Sequence[Any]], ClaimedJob]", functools.partial(tuple.__new__, cls)
    )


_META_AT = len(ClaimedJob._fields)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: ``JobContext._meta`` of a context whose worker did not read the job's meta.
_UNREAD: Any = object()
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
#: Reads the stored results of a job's parents: job id -> {parent id: result}.
ResultsReader = Callable[[int], dict[int, Any]]
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
    #: The handler took a Session whose writes commit with the job's completion: :meth:`step`
    #: and :meth:`astep` refuse to run (set by whoever runs the handler, the worker or
    #: ``sqla_jobs.testing``).
    in_session: bool = field(default=False, repr=False)
    #: Reads :attr:`parent_results` (set by the worker and ``sqla_jobs.testing``).
    reader: ResultsReader | None = field(default=None, repr=False)
    # The job's meta as the claim returned it, or _UNREAD. A class attribute, not a dataclass
    # field: the worker sets it on the contexts of its jobs only when a middleware reads meta,
    # and no other context pays a store for it.
    _meta = _UNREAD

    @property
    def meta(self) -> dict[str, Any]:
        """The job's ``meta`` as stored at enqueue (the ``on_enqueue`` hooks' additions
        included); ``{}`` for a job without meta. Changing the dict changes nothing stored.

        The worker reads meta only when a middleware asks for it
        (``jobs.hooks.middleware(fn, meta=True)``, as tracing does), so that no other worker's
        claim fetches the column: without one (and under ``sqla_jobs.testing``, which runs no
        middleware) this raises :class:`~sqla_jobs.ConfigurationError`.
        """
        value = self._meta
        if value is _UNREAD:
            raise ConfigurationError(
                f"job {self.job_id} ({self.kind}): ctx.meta was not read; the worker reads each "
                "job's meta only when a middleware registered with "
                "jobs.hooks.middleware(fn, meta=True) exists when it starts"
            )
        if value is None:
            value = self._meta = {}
        elif isinstance(value, str):
            value = self._meta = json.loads(value)
        return typing.cast(dict[str, Any], value)

    def _read_meta(self, job: ClaimedJob) -> None:
        """Take the meta ``job`` was claimed with, when its claim returned it (a
        :class:`ClaimedWithMeta`)."""
        if job.__class__ is ClaimedWithMeta:
            self._meta = job.meta

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

    if not typing.TYPE_CHECKING:  # a __getattr__ would let mypy accept any attribute of ctx

        def __getattr__(self, name: str) -> Any:
            # Reached only for an attribute missing from the instance's dict: the created_at of
            # a context for_job built, which holds the claim's microseconds instead.
            if name == "created_at":
                us = self.__dict__.get("_created_us")
                if us is not None:
                    value = _EPOCH + timedelta(microseconds=us)
                    self.__dict__["created_at"] = value
                    return value
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
        reader: ResultsReader | None = None,
    ) -> JobContext:
        """The context of a job just claimed by ``worker``, starting now (``timeout``: the kind's,
        in seconds)."""
        steps = job.steps
        if steps is None or steps == "{}":
            steps = {}  # most jobs recorded no step: no JSON to parse
        elif steps.__class__ is str:
            steps = json.loads(steps) or {}
        else:
            steps = dict(steps or {})  # type: ignore[arg-type]
        # The instance's dict built in one store, not through the dataclass's __init__ (keyword
        # arguments and defaults cost ~0.5 us per job); test_context checks it holds every field.
        ctx = object.__new__(cls)
        ctx.__dict__ = {
            "job_id": job.id,
            "kind": job.kind,
            "queue": job.queue,
            "attempt": job.attempts,
            "crashes": job.crashes,
            "max_attempts": job.max_attempts,
            # ctx.created_at is built from it on first read (by __getattr__): most handlers
            # never ask, and a timestamptz parsed per claimed row cost ~0.8 us.
            "_created_us": job.created_us,
            "worker": worker,
            "_lease_lost": None,
            "_cancelled": None,
            "steps": steps,
            "lease_token": job.lease_token,
            "recorder": recorder,
            "interruptions": job.interruptions,
            "deadline": None if timeout is None else time.monotonic() + timeout,
            "in_session": False,
            "reader": reader,
        }
        return ctx

    @property
    def parent_results(self) -> dict[int, Any]:
        """What this job's parents (``depends_on``) of kinds with ``results=True`` returned, by
        parent id, in JSON form (a pydantic model as its ``model_dump(mode="json")``). A parent
        of a kind without results has no entry. Read on first access with one short query (a
        job that never asks pays nothing), then kept; an ``async`` handler should prefer
        :meth:`aparent_results`, which does not block the event loop."""
        cached: dict[int, Any] | None = self.__dict__.get("_parent_results")
        if cached is None:
            if self.reader is None:
                raise ConfigurationError(
                    "ctx.parent_results needs a context created by a worker or sqla_jobs.testing"
                )
            cached = self.__dict__["_parent_results"] = self.reader(self.job_id)
        return cached

    async def aparent_results(self) -> dict[int, Any]:
        """:attr:`parent_results`, read from a thread so the event loop is not blocked."""
        if "_parent_results" in self.__dict__:
            return self.parent_results
        return await asyncio.to_thread(lambda: self.parent_results)

    def step(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once for this job and record its JSON-serializable result.

        If an earlier run of the job recorded step ``name``, return that result (in its JSON form:
        tuples come back as lists) without calling ``fn``. The record is written in its own short
        transaction, fenced on the lease: :class:`LeaseLostError` if another worker owns the job
        now. Not exactly-once: if the process dies after ``fn``'s side effect and before the
        record, ``fn`` runs again on the retry.
        """
        self._refuse_in_session(name)
        if name in self.steps:
            return typing.cast(T, self.steps[name])
        self._refuse_if_cancelled(name)
        result = fn(*args, **kwargs)
        self._record(name, result)
        return result

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`step` for async code: ``fn`` may be a coroutine function; the record is written
        from a thread so the event loop is not blocked."""
        self._refuse_in_session(name)
        if name in self.steps:
            return self.steps[name]
        self._refuse_if_cancelled(name)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        await asyncio.to_thread(self._record, name, result)
        return result

    def _refuse_in_session(self, name: str) -> None:
        # A step's record commits on its own, at once; the session's writes commit only with the
        # completion. After a failed run the record would say "done" of writes that rolled back.
        if self.in_session:
            raise StepError(
                f"job {self.job_id} ({self.kind}): step {name!r} refused: durable steps do not "
                "mix with a handler that takes a session, whose writes commit only with the "
                "job's completion (a recorded step would outlive writes that rolled back); the "
                "run is all-or-nothing already: split the work into jobs instead"
            )

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
