"""OpenTelemetry tracing: the implementation of :mod:`sqla_jobs.otel`."""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sqla_jobs.context import JobContext, Snooze
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.hooks import CallNext, EnqueueBatch, OutcomeEvent
from sqla_jobs.jobs import Jobs

#: ``messaging.system``: sqla-jobs is not one of the conventions' well-known systems.
SYSTEM = "sqla_jobs"
#: The keys of a job's ``meta`` that carry the trace context (W3C Trace Context's header names).
TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
#: The outcomes a span records as an error (``sqla_jobs.outcome``; see ``OutcomeEvent``).
ERRORS = frozenset({"failed", "dead"})
#: The parent of every run's span: none (a run is linked to its enqueuer, never its child).
_ROOT = Context()


def instrument(jobs: Jobs, tracer_provider: TracerProvider | None = None) -> None:
    """Trace ``jobs``: a span for each run of a handler, linked to the trace that enqueued its job.

    Call it once, where ``jobs`` is set up: before enqueueing (jobs enqueued earlier have no
    link) and before workers start (a worker decides at start to claim each job's meta, which
    the link is read from), and before registering other middleware, so that the span wraps
    theirs. Spans go to ``tracer_provider``, by default the global one
    (``opentelemetry.trace.set_tracer_provider``), which may be set after this call.

    Each run's span is named ``process <queue>``, of kind CONSUMER, with the attributes
    ``messaging.system`` (``sqla_jobs``), ``messaging.operation.type`` and
    ``messaging.operation.name`` (``process``), ``messaging.destination.name`` (the queue),
    ``messaging.message.id`` (the job's id), ``messaging.client.id`` (the worker's name),
    ``sqla_jobs.kind``, ``sqla_jobs.attempt`` (1 on the first run) and, when the run ends,
    ``sqla_jobs.outcome`` (``completed``, ``failed``, ``dead``, ``cancelled``, ``snoozed``). What
    the handler raised is recorded on it (``record_exception``; not a snooze); a failed or dead
    run sets the status to ERROR, with ``error.type``. A success leaves it unset, as the
    specification asks of instrumentation libraries. A run stopped at the worker's shutdown (its
    job given back) ends its span with no outcome. A job that cannot run (an unknown kind, a
    payload that no longer validates) or is cancelled before it starts has no span.

    Raises :class:`~sqla_jobs.ConfigurationError` if ``jobs`` is instrumented already.
    """
    hooks = jobs.hooks
    if any(isinstance(getattr(m, "__self__", None), _Tracing) for m in hooks.middlewares):
        raise ConfigurationError(
            "these jobs are traced already: call sqla_jobs.otel.instrument(jobs) once"
        )
    tracing = _Tracing(
        trace.get_tracer("sqla_jobs.otel", _version(), tracer_provider=tracer_provider)
    )
    hooks.on_enqueue(tracing.stamp)
    hooks.middleware(tracing.run, meta=True)
    hooks.on_outcome(tracing.end)


class _Tracing:
    """The three hooks of one :func:`instrument`, and the spans of the runs not yet ended."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        #: The span of each run whose outcome is not told yet, by (job id, attempt): a job's
        #: claim counts an attempt, so the key names one run even across workers in one process.
        self._open: dict[tuple[int, int], Span] = {}

    def stamp(self, batch: EnqueueBatch) -> None:
        """on_enqueue: store the current trace context in every job of the batch."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)  # nothing without a valid current span
        if carrier:
            batch.add_meta(carrier)

    async def run(self, ctx: JobContext, call_next: CallNext) -> None:
        """middleware: the run's span, current around the handler, left open for :meth:`end`."""
        span = self._tracer.start_span(
            f"process {ctx.queue}",
            context=_ROOT,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": ctx.queue,
                "messaging.message.id": str(ctx.job_id),
                "messaging.client.id": ctx.worker,
                "sqla_jobs.kind": ctx.kind,
                "sqla_jobs.attempt": ctx.attempt,
            },
            links=self._links(ctx),
        )
        key = (ctx.job_id, ctx.attempt)
        self._open[key] = span
        raised: BaseException | None = None
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                await call_next()
        except BaseException as exc:
            raised = exc
            if not isinstance(exc, Snooze):
                span.record_exception(exc)
            raise
        finally:
            # The worker tells the outcome (end) right after the chain returns, before it yields
            # to the event loop; a run it tells none of (stopped at shutdown, or a lost lease in
            # a handler's session) is ended here, on the loop's next turn.
            asyncio.get_running_loop().call_soon(self._end_untold, key, span, raised)

    def end(self, event: OutcomeEvent) -> None:
        """on_outcome: record how the run ended on its span, and end it."""
        span = self._open.pop((event.job_id, event.attempt), None)
        if span is None:
            return  # never ran a handler: no span
        span.set_attribute("sqla_jobs.outcome", event.outcome)
        if event.outcome in ERRORS:
            exc = event.exception
            span.set_attribute("error.type", _error_type(exc) if exc else "_OTHER")
            span.set_status(Status(StatusCode.ERROR, event.error))
        span.end()

    def _end_untold(self, key: tuple[int, int], span: Span, raised: BaseException | None) -> None:
        if self._open.get(key) is not span:
            return  # ended by its outcome
        del self._open[key]
        if raised is not None and not isinstance(raised, asyncio.CancelledError):
            span.set_attribute("error.type", _error_type(raised))
            span.set_status(Status(StatusCode.ERROR, str(raised)))
        span.end()

    def _links(self, ctx: JobContext) -> tuple[Link, ...]:
        """A link to the trace context stored at enqueue; none if there is none."""
        try:
            meta = ctx.meta
        except ConfigurationError:
            return ()  # instrumented after this worker started: it does not read meta
        carrier = {k: v for k in (TRACEPARENT, TRACESTATE) if isinstance(v := meta.get(k), str)}
        if TRACEPARENT not in carrier:
            return ()
        found = trace.get_current_span(self._propagator.extract(carrier)).get_span_context()
        return (Link(found),) if found.is_valid else ()


def _error_type(exc: BaseException) -> str:
    # The exception's fully qualified class name, as the conventions ask and the SDK's
    # record_exception writes it (builtins without their module).
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _version() -> str | None:
    try:
        return version("sqla-jobs")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return None


__all__ = ["SYSTEM", "TRACEPARENT", "TRACESTATE", "instrument"]
