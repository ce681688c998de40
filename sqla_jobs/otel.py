"""Tracing with OpenTelemetry: a span per run of a job, linked to the trace that enqueued it.

:func:`instrument` registers three hooks on ``jobs.hooks`` (:mod:`sqla_jobs.hooks`):

- **on_enqueue**: the trace context current at enqueue goes into each job's ``meta`` as W3C Trace
  Context (``meta["traceparent"]``, and ``meta["tracestate"]`` when there is one), on every
  enqueue path (``enqueue_many`` by COPY included), once per batch. With no span active, nothing.
- **middleware**: each run of a handler is a ``process <queue>`` span of kind CONSUMER, after the
  OpenTelemetry messaging conventions, current while the handler runs (a sync handler's thread
  too), and linked to the context stored at enqueue: a link, not a parent, as the conventions
  recommend for consumers (a job runs long after the request that enqueued it, maybe more than
  once), so each run is the root of a trace of its own.
- **on_outcome**: ends the span with the run's outcome (``sqla_jobs.outcome``).

No producer span at enqueue: the hook runs before the INSERT or COPY, and cannot see it end nor
whether its transaction commits, so a ``send`` span would have no duration and would stay for
jobs a rollback discarded; the enqueuing span itself (the request's) is the creation context, and
the INSERT is already a span of the application's database instrumentation, under it.

Only this module (and the private one behind it, ``sqla_jobs/observe/tracing.py``) imports
opentelemetry, and only its API (the ``otel`` extra): the application installs and configures the
SDK and its exporters. ``import sqla_jobs`` never imports it.
"""

from __future__ import annotations

from sqla_jobs.observe.tracing import SYSTEM, TRACEPARENT, TRACESTATE, instrument

__all__ = ["SYSTEM", "TRACEPARENT", "TRACESTATE", "instrument"]
