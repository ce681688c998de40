"""Hooks: where metrics and tracing plug into enqueue and the worker, without patching either.

Registered on ``jobs.hooks`` (a :class:`Hooks`), before the worker starts or enqueue is called:

- :meth:`Hooks.on_enqueue` sees every job before it is inserted, one call per batch (an
  ``enqueue`` is a batch of one; ``enqueue_many`` calls once per 1,024 jobs), and may add to the
  jobs' ``meta``: where a trace context travels from the enqueuer to the worker.
- :meth:`Hooks.middleware` wraps each run of a handler, sync or async: a span, a timer, a log
  context around it.
- :meth:`Hooks.on_outcome` hears how each run ended: counters and histograms.

With no hook registered, each call site costs one test of an empty tuple. The shapes follow Oban's
telemetry events (a small event per outcome, handlers that may not break the caller) and River's
middleware (a chain around the work, which calls the next link).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from sqla_jobs.context import JobContext
from sqla_jobs.enqueue.row import NAMES, Batch, Prepared
from sqla_jobs.enqueue.validate import meta_json
from sqla_jobs.errors import ConfigurationError, EnqueueHookError

if TYPE_CHECKING:
    from sqla_jobs._outcome import Outcome

log = logging.getLogger("sqla_jobs.hooks")

_KIND_AT, _QUEUE_AT, _META_AT = (NAMES.index(n) for n in ("kind", "queue", "meta"))

#: How a run ended, as :class:`OutcomeEvent` says it.
OutcomeName = Literal["completed", "failed", "dead", "cancelled", "snoozed"]
#: An ``on_enqueue`` hook.
EnqueueHook = Callable[["EnqueueBatch"], None]
#: What a middleware awaits to run the rest of the chain and the handler.
CallNext = Callable[[], Awaitable[None]]
#: A middleware: ``async def middleware(ctx, call_next) -> None``.
Middleware = Callable[[JobContext, CallNext], Awaitable[None]]
#: An ``on_outcome`` hook.
OutcomeHook = Callable[["OutcomeEvent"], None]
F = TypeVar("F", bound=Callable[..., Any])


class EnqueueBatch:
    """The jobs of one enqueue call (or of one chunk of up to 1,024 jobs of an ``enqueue_many``),
    as an ``on_enqueue`` hook sees them before they are inserted.

    ``kinds`` and ``queues`` hold each job's kind name and queue, in order (read them, do not change
    them). A hook adds to the jobs' meta with :meth:`add_meta` (the same values for every job:
    checked and serialized once per distinct meta, not once per job) or reads and changes one job's
    through :attr:`metas` (a dict per job, built on first use). What the hooks leave is checked as
    ``meta=`` is (:class:`~sqla_jobs.InvalidMetaError`) before any SQL runs.
    """

    __slots__ = ("_first", "_metas", "_shared", "_texts", "kinds", "queues")

    def __init__(
        self, kinds: list[str], queues: list[str], texts: list[str | None], first: int = 0
    ) -> None:
        #: Each job's kind name.
        self.kinds = kinds
        #: Each job's queue.
        self.queues = queues
        self._texts = texts
        self._shared: dict[str, Any] = {}
        self._metas: list[dict[str, Any]] | None = None
        #: The position of the batch's first job in the enqueue call (for error messages).
        self._first = first

    def __len__(self) -> int:
        return len(self.kinds)

    def add_meta(self, values: Mapping[str, Any]) -> None:
        """Add ``values`` to the meta of every job of the batch, replacing the keys it has. Cheap
        for any size of batch: this is how a trace context is stamped on a bulk enqueue."""
        if self._metas is None:
            self._shared.update(values)
        else:
            for meta in self._metas:
                meta.update(values)

    @property
    def metas(self) -> list[dict[str, Any]]:
        """Each job's meta as a dict of its own, in order (``{}`` for a job without meta): change
        one to change that job's. Built on first use, at the cost of a dict per job; with it, each
        job's meta is serialized on its own."""
        if self._metas is None:
            shared = self._shared
            self._metas = [
                dict(shared) if t is None else {**json.loads(t), **shared} for t in self._texts
            ]
        return self._metas

    def _result(self) -> list[str | None] | None:
        """The jobs' meta texts after the hooks, checked; None when no hook changed any."""
        if self._metas is not None:
            return [
                None if t is None and not m else meta_json(m, f"meta of job {i} after on_enqueue")
                for i, (t, m) in enumerate(
                    zip(self._texts, self._metas, strict=True), start=self._first
                )
            ]
        shared = self._shared
        if not shared:
            return None
        merged: dict[str | None, str | None] = {}
        for t in dict.fromkeys(self._texts):
            meta = shared if t is None else {**json.loads(t), **shared}
            merged[t] = meta_json(meta, "meta after on_enqueue")
        return [merged[t] for t in self._texts]


@dataclass(frozen=True)
class OutcomeEvent:
    """How one run of a job ended, as the worker decided it, told to ``on_outcome`` hooks.

    ``outcome`` is ``completed``, ``failed`` (to be retried), ``dead`` (``Discard``, a payload that
    no longer validates, or the last attempt failed), ``cancelled`` (by an operator, whether it ran
    or not) or ``snoozed``. A crash is never heard: the worker that crashed cannot tell, and the
    reaper finds it later. ``attempt`` is 1 on the first run; ``duration`` the handler's run time in
    seconds (0 for a job cancelled before it started); ``exception`` what the handler raised
    (None when it returned, or when the job could not run: an unknown kind or a payload that no
    longer validates, described by ``error``).

    ``cancel_requested`` is True for a run an operator asked to cancel while it ran: on a
    ``completed`` outcome, a handler that returned anyway (a sync handler that did not check
    ``ctx.cancelled``).

    The event is told when the run ends, before the worker writes the outcome (writes are batched):
    a lease lost in between voids the write, and a cancel requested meanwhile turns the write of a
    failure into ``cancelled``; neither is told again.
    """

    job_id: int
    kind: str
    queue: str
    outcome: OutcomeName
    attempt: int
    duration: float
    exception: BaseException | None
    error: str | None
    cancel_requested: bool = False


class Hooks:
    """The hooks of one :class:`~sqla_jobs.Jobs`: ``jobs.hooks``.

    Each method registers a function and returns it (so it works as a decorator); hooks run in the
    order registered. Register them before enqueueing or starting a worker: the lists are replaced,
    never changed in place, so a registration is seen by calls that start after it.
    """

    def __init__(self) -> None:
        self.enqueue_hooks: tuple[EnqueueHook, ...] = ()
        self.middlewares: tuple[Middleware, ...] = ()
        self.outcome_hooks: tuple[OutcomeHook, ...] = ()
        #: A middleware reads ``ctx.meta``: workers started from now on claim each job's meta.
        self.reads_meta = False

    def on_enqueue(self, fn: EnqueueHook) -> EnqueueHook:
        """Call ``fn(batch)`` with the jobs of each enqueue (:class:`EnqueueBatch`), before any SQL
        runs, on every path: ``enqueue``, ``enqueue_many`` by INSERT and by COPY, sync and async.

        ``enqueue_many`` calls it once per chunk of up to 1,024 jobs, as it validates them: past
        the first chunk, while the server stores the previous ones. If ``fn`` raises, the enqueue
        raises :class:`~sqla_jobs.EnqueueHookError` (caused by it): nothing is written and the
        transaction stays usable, as for any :class:`~sqla_jobs.EnqueueError`. It runs on the
        caller's thread (for the async calls, inside the ``AsyncSession``'s greenlet: it must not
        await).
        """
        _check_sync(fn, "an on_enqueue hook")
        self.enqueue_hooks = (*self.enqueue_hooks, fn)
        return fn

    def middleware(self, fn: F, *, meta: bool = False) -> F:
        """Run each job's handler inside ``async def fn(ctx, call_next)``, which must ``await
        call_next()`` once; the first registered is the outermost.

        ``meta=True``: ``fn`` reads :attr:`JobContext.meta <sqla_jobs.JobContext.meta>` (a trace
        context stored at enqueue). A worker started after such a registration claims each job's
        ``meta`` with it (one more column per claimed job); other workers never read the column.

        ``fn`` runs on the worker's event loop for sync and async handlers alike: for a sync
        handler, ``call_next()`` runs it on its thread and waits for it (the context variables
        ``fn`` set are copied to that thread, so a span opened around ``call_next`` is the
        handler's current span). The kind's timeout applies to the handler, not to ``fn``.
        Exceptions pass through unchanged, in both directions: the handler's (``Snooze``,
        ``Discard``, a failure, a cancellation) reach the worker's outcome rules as if there were
        no middleware, unless ``fn`` swallows them (the run then completes); one ``fn`` raises
        itself is the run's failure. Calling ``call_next`` twice raises ``RuntimeError``.
        """
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(
                f"middleware {_name(fn)} must be an async function (async def fn(ctx, call_next)):"
                " it runs on the worker's event loop, for sync handlers too"
            )
        self.middlewares = (*self.middlewares, fn)
        if meta:
            self.reads_meta = True
        return fn

    def on_outcome(self, fn: OutcomeHook) -> OutcomeHook:
        """Call ``fn(event)`` (:class:`OutcomeEvent`) each time a run of a job ends, and for each
        job cancelled before it started.

        ``fn`` runs on the worker's event loop, so it must be quick and must not block (hand slow
        work to a queue or a thread). An exception it raises is logged (``hook_failed``, with its
        traceback) and otherwise ignored: it never changes the outcome or stops the worker.
        """
        _check_sync(fn, "an on_outcome hook")
        self.outcome_hooks = (*self.outcome_hooks, fn)
        return fn

    # -- the call sites' side (private) ---------------------------------------------------------

    def _enqueue_one(self, job: Prepared) -> Prepared:
        """``job`` after the on_enqueue hooks (called with a batch of one)."""
        batch = Batch()
        batch.add(job)
        texts = self._apply(batch)
        return job if texts is None else replace(job, meta=texts[0])

    def _enqueue_chunks(self, chunks: Iterator[Batch]) -> Iterator[Batch]:
        """``chunks`` with the on_enqueue hooks applied to each as it is asked for."""
        first = 0
        for batch in chunks:
            texts = self._apply(batch, first)
            if texts is not None:
                batch.columns[_META_AT] = texts
            first += len(batch)
            yield batch

    def _apply(self, batch: Batch, first: int = 0) -> list[str | None] | None:
        view = EnqueueBatch(
            batch.columns[_KIND_AT], batch.columns[_QUEUE_AT], batch.columns[_META_AT], first
        )
        for hook in self.enqueue_hooks:
            try:
                hook(view)
            except Exception as exc:
                raise EnqueueHookError(
                    f"on_enqueue hook {_name(hook)} raised {type(exc).__name__}: {exc}; nothing "
                    "was enqueued"
                ) from exc
        return view._result()

    def _report(self, outcome: Outcome, exception: BaseException | None) -> None:
        """Tell the on_outcome hooks how ``outcome``'s run ended; never raises."""
        job = outcome.job
        event = OutcomeEvent(
            job_id=job.id,
            kind=job.kind,
            queue=job.queue,
            outcome=_name_of(outcome),
            attempt=job.attempts,
            duration=outcome.runtime,
            exception=exception,
            error=outcome.error,
            cancel_requested=outcome.cancelled or outcome.cancel_ignored,
        )
        for hook in self.outcome_hooks:
            try:
                hook(event)
            except Exception:
                log.exception(
                    "on_outcome hook %s raised (ignored) for job %s (%s)",
                    _name(hook),
                    job.id,
                    job.kind,
                    extra={"event": "hook_failed", "job_id": job.id, "kind": job.kind},
                )


async def run_middleware(
    chain: tuple[Middleware, ...], ctx: JobContext, call: Callable[[], Awaitable[None]]
) -> None:
    """Await ``call()`` (the handler's run) inside the middlewares of ``chain``, the first
    outermost."""
    await _link(chain, 0, ctx, call)()


def _link(
    chain: tuple[Middleware, ...], i: int, ctx: JobContext, call: Callable[[], Awaitable[None]]
) -> CallNext:
    if i == len(chain):
        return call
    middleware, rest = chain[i], _link(chain, i + 1, ctx, call)
    called = False

    def call_next() -> Awaitable[None]:
        nonlocal called
        if called:
            raise RuntimeError(f"middleware {_name(middleware)} called call_next twice")
        called = True
        return rest()

    return lambda: middleware(ctx, call_next)


def _name_of(outcome: Outcome) -> OutcomeName:
    if outcome.cancelled:
        return "cancelled"
    if outcome.snooze_us is not None:
        return "snoozed"
    if outcome.error is None:
        return "completed"
    job = outcome.job
    # The fail statement's own rule (sqla_jobs.sql.outcomes.fail): dead when forced or the budget is spent.
    if outcome.dead or job.attempts - job.crashes >= job.max_attempts:
        return "dead"
    return "failed"


def _check_sync(fn: Callable[..., Any], what: str) -> None:
    if not callable(fn):
        raise ConfigurationError(f"{what} must be callable, got {type(fn).__qualname__}")
    if inspect.iscoroutinefunction(fn):
        raise ConfigurationError(
            f"{what} must be a plain function, not async: {_name(fn)} is called where nothing "
            "awaits it"
        )


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


__all__ = [
    "CallNext",
    "EnqueueBatch",
    "EnqueueHook",
    "Hooks",
    "Middleware",
    "OutcomeEvent",
    "OutcomeHook",
    "OutcomeName",
]
