"""Tracing (sqla_jobs.otel) against a real PostgreSQL and in-process workers: the trace context
stored at enqueue on every path, a CONSUMER span per run linked to it, each outcome recorded, and
no opentelemetry import for an application that does not ask for it."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, get_current_span
from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import ConfigurationError, Discard, JobContext, Jobs, Snooze, Unique
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.enqueue.insert import COPY_THRESHOLD
from sqla_jobs.observe.tracing import instrument
from tests._waiting import DEADLINE

from ._workers import running_workers, wait_until
from .test_hooks import stored_metas
from .test_worker import enqueue, job_row, make_due

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Ping(BaseModel):
    n: int = 0


class Order(BaseModel):
    order_id: int


class Act(BaseModel):
    do: str = "return"


class Tracing:
    """An SDK tracer provider recording every span in memory, and jobs traced through it."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests.app")
        self.jobs = Jobs()

    def instrument(self) -> None:
        instrument(self.jobs, tracer_provider=self.provider)

    def runs(self) -> list[ReadableSpan]:
        """The finished spans of job runs."""
        return [s for s in self.exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]

    def wait_for_runs(self, n: int) -> list[ReadableSpan]:
        wait_until(lambda: len(self.runs()) >= n, what=f"{n} run spans ended")
        spans = self.runs()
        assert len(spans) == n, [s.name for s in spans]
        return spans

    def run_of(self, job_id: int, spans: list[ReadableSpan] | None = None) -> ReadableSpan:
        (found,) = [
            s
            for s in (self.runs() if spans is None else spans)
            if s.attributes is not None and s.attributes["messaging.message.id"] == str(job_id)
        ]
        return found


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    t = Tracing()
    yield t
    t.provider.shutdown()


def linked_to(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def ids_of(context: SpanContext) -> tuple[int, int]:
    return (context.trace_id, context.span_id)


def traceparent(context: SpanContext) -> str:
    """The W3C traceparent of ``context``."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def exception_class(attributes: Any) -> str:
    """The class name of an exception event (SDKs before 1.27 write no module)."""
    return str(attributes["exception.type"]).rsplit(".", 1)[-1]


def test_each_run_is_a_consumer_span_linked_to_the_span_that_enqueued_its_job(
    tracing: Tracing, clean: Engine, migrated_url: str
) -> None:
    """On each enqueue path (one job, a unique job, enqueue_many by INSERT and by COPY), the
    enqueuing span's context is stored in the job's meta, and the job's run links to it."""
    jobs = tracing.jobs
    jobs.register("ping", Ping, lambda args, ctx: None, queue="mail")
    jobs.register("refresh", Order, lambda args, ctx: None, unique=Unique(by=("order_id",)))
    tracing.instrument()
    #: job id -> (kind, queue, the context of the span that enqueued it)
    enqueued: dict[int, tuple[str, str, SpanContext]] = {}
    with Session(clean) as session:
        with tracing.tracer.start_as_current_span("POST /signup") as span:
            tagged = jobs.enqueue(session, Ping(), meta={"tenant": "acme"}).id
            enqueued[tagged] = ("ping", "mail", span.get_span_context())
        with tracing.tracer.start_as_current_span("POST /orders/7") as span:
            unique = jobs.enqueue(session, Order(order_id=7))
            assert unique.inserted
            enqueued[unique.id] = ("refresh", "default", span.get_span_context())
        for size in (3, COPY_THRESHOLD):  # by INSERT, then by COPY
            with tracing.tracer.start_as_current_span(f"import {size}") as span:
                for job_id in jobs.enqueue_many(session, [Ping(n=i) for i in range(size)]):
                    enqueued[job_id] = ("ping", "mail", span.get_span_context())
        session.commit()
    metas = dict(zip(enqueued, stored_metas(clean, list(enqueued)), strict=True))
    for job_id, (_, _, context) in enqueued.items():
        assert metas[job_id]["traceparent"] == traceparent(context)
        assert "tracestate" not in metas[job_id]  # none was set
    assert metas[tagged]["tenant"] == "acme"

    with running_workers(jobs, migrated_url, poll_interval=0.1) as (worker,):
        spans = tracing.wait_for_runs(len(enqueued))
    for job_id, (kind, queue, context) in enqueued.items():
        span = tracing.run_of(job_id, spans)
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is None, "a run is a trace of its own, linked to its enqueuer"
        assert linked_to(span) == [ids_of(context)]
        assert span.status.status_code is StatusCode.UNSET
        assert span.events == ()
        assert span.name == f"process {queue}"
        assert dict(span.attributes or {}) == {
            "messaging.system": "sqla_jobs",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": str(job_id),
            "messaging.client.id": worker.name,
            "sqla_jobs.kind": kind,
            "sqla_jobs.attempt": 1,
            "sqla_jobs.outcome": "completed",
        }


def test_async_enqueue_stores_the_trace_context_too(
    tracing: Tracing, clean: Engine, migrated_url: str
) -> None:
    jobs = tracing.jobs
    jobs.register("ping", Ping)
    tracing.instrument()

    async def main() -> tuple[list[int], SpanContext]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                with tracing.tracer.start_as_current_span("async handler") as span:
                    ids = [(await jobs.enqueue_async(session, Ping())).id]
                    payloads = [Ping(n=i) for i in range(COPY_THRESHOLD)]
                    ids += await jobs.enqueue_many_async(session, payloads)
                await session.commit()
                return ids, span.get_span_context()
        finally:
            await engine.dispose()

    ids, context = asyncio.run(main())
    assert stored_metas(clean, ids) == [{"traceparent": traceparent(context)}] * len(ids)


def test_a_job_enqueued_with_no_active_span_runs_in_a_span_without_a_link(
    tracing: Tracing, clean: Engine, migrated_url: str
) -> None:
    jobs = tracing.jobs
    jobs.register("ping", Ping, lambda args, ctx: None)
    tracing.instrument()
    (plain,) = enqueue(clean, jobs, [Ping()])
    (tagged,) = enqueue(clean, jobs, [Ping()], meta={"tenant": "acme"})
    assert stored_metas(clean, [plain, tagged]) == [None, {"tenant": "acme"}]
    with running_workers(jobs, migrated_url, poll_interval=0.1):
        spans = tracing.wait_for_runs(2)
    for job_id in (plain, tagged):
        span = tracing.run_of(job_id, spans)
        assert span.links == ()
        assert span.attributes is not None
        assert span.attributes["sqla_jobs.outcome"] == "completed"


@pytest.mark.parametrize("style", ["sync", "async"])
def test_the_run_span_is_current_in_the_handler_and_records_each_outcome(
    tracing: Tracing, clean: Engine, migrated_url: str, style: str
) -> None:
    """A failure records the exception and an ERROR status (failed, then dead on the last
    attempt); a Discard is dead; a snooze records its outcome without an error; the span is the
    current span inside a sync handler's thread as inside an async handler."""
    jobs = tracing.jobs
    current: dict[tuple[int, int], tuple[int, int]] = {}

    def act(args: Act, ctx: JobContext) -> None:
        current[(ctx.job_id, ctx.attempt)] = ids_of(get_current_span().get_span_context())
        if args.do == "raise":
            raise ValueError("boom")
        if args.do == "snooze":
            raise Snooze(3600)
        if args.do == "discard":
            raise Discard("gone")

    if style == "sync":
        jobs.register("act", Act, act, max_attempts=2)
    else:

        async def act_async(args: Act, ctx: JobContext) -> None:
            await asyncio.sleep(0)
            act(args, ctx)

        jobs.register("act", Act, act_async, max_attempts=2)
    tracing.instrument()
    with tracing.tracer.start_as_current_span("request") as request:
        done, failing, snoozed, discarded = enqueue(
            clean, jobs, [Act(do=d) for d in ("return", "raise", "snooze", "discard")]
        )
    with running_workers(jobs, migrated_url, poll_interval=0.1):
        tracing.wait_for_runs(4)
        make_due(clean, failing)  # its retry, the last attempt: fails too, and is dead
        spans = tracing.wait_for_runs(5)

    for span in spans:
        assert span.attributes is not None
        assert span.context is not None
        job_id, attempt = (
            int(str(span.attributes["messaging.message.id"])),
            span.attributes["sqla_jobs.attempt"],
        )
        assert current[(job_id, int(str(attempt)))] == ids_of(span.context)
        assert linked_to(span) == [ids_of(request.get_span_context())]

    def outcome(span: ReadableSpan) -> tuple[Any, ...]:
        attrs = span.attributes or {}
        return (
            attrs["sqla_jobs.attempt"],
            attrs["sqla_jobs.outcome"],
            span.status.status_code,
            attrs.get("error.type"),
            [(e.name, exception_class(e.attributes)) for e in span.events],
        )

    exception = [("exception", "ValueError")]
    runs_of_failing = sorted(
        (
            outcome(s)
            for s in spans
            if s.attributes and s.attributes["messaging.message.id"] == str(failing)
        ),
        key=lambda o: int(o[0]),
    )
    assert runs_of_failing == [
        (1, "failed", StatusCode.ERROR, "ValueError", exception),
        (2, "dead", StatusCode.ERROR, "ValueError", exception),
    ]
    assert outcome(tracing.run_of(done, spans)) == (1, "completed", StatusCode.UNSET, None, [])
    assert outcome(tracing.run_of(snoozed, spans)) == (1, "snoozed", StatusCode.UNSET, None, [])
    assert outcome(tracing.run_of(discarded, spans)) == (
        1,
        "dead",
        StatusCode.ERROR,
        "sqla_jobs.context.Discard",
        [("exception", "Discard")],
    )
    failed = [s for s in spans if s.attributes and s.attributes["sqla_jobs.outcome"] == "failed"]
    assert failed[0].status.description is not None
    assert failed[0].status.description.startswith("ValueError: boom")
    assert job_row(clean, failing).state == "dead"  # type: ignore[union-attr]


def test_a_cancelled_run_and_a_run_stopped_at_shutdown_end_their_spans(
    tracing: Tracing, clean: Engine, migrated_url: str
) -> None:
    """An operator's cancel is the outcome ``cancelled``, not an error; a run cancelled at the
    shutdown timeout (its job given back) ends its span with no outcome."""
    jobs = tracing.jobs
    started: dict[int, threading.Event] = {}

    @jobs.kind("slow", Ping)
    async def slow(args: Ping, ctx: JobContext) -> None:
        started[args.n].set()
        await asyncio.sleep(3600)

    tracing.instrument()
    started.update({0: threading.Event(), 1: threading.Event()})
    with running_workers(jobs, migrated_url, poll_interval=0.1, shutdown_timeout=0.2):
        cancelled, interrupted = enqueue(clean, jobs, [Ping(n=0), Ping(n=1)])
        assert started[0].wait(DEADLINE)
        assert started[1].wait(DEADLINE)
        with Session(clean) as session, session.begin():
            jobs.cancel(session, [cancelled])
        tracing.wait_for_runs(1)
    spans = tracing.wait_for_runs(2)
    span = tracing.run_of(cancelled, spans)
    assert span.attributes is not None
    assert span.attributes["sqla_jobs.outcome"] == "cancelled"
    assert span.status.status_code is StatusCode.UNSET
    span = tracing.run_of(interrupted, spans)
    assert span.attributes is not None
    assert "sqla_jobs.outcome" not in span.attributes
    assert span.status.status_code is StatusCode.UNSET
    assert [exception_class(e.attributes) for e in span.events] == ["CancelledError"]
    assert job_row(clean, interrupted).state == "pending"  # type: ignore[union-attr]


def test_a_job_that_cannot_run_has_no_span_and_leaves_no_span_open(
    tracing: Tracing, clean: Engine, migrated_url: str
) -> None:
    jobs = tracing.jobs
    jobs.register("ping", Ping, lambda args, ctx: None)
    tracing.instrument()
    other = Jobs()
    other.register("elsewhere", Ping)  # a kind this worker has no handler for
    (unknown,) = enqueue(clean, other, [Ping()])
    (known,) = enqueue(clean, jobs, [Ping()])
    with running_workers(jobs, migrated_url, poll_interval=0.1):
        wait_until(
            lambda: job_row(clean, unknown).attempts == 1,  # type: ignore[union-attr]
            what="the unknown kind was tried",
        )
        spans = tracing.wait_for_runs(1)
    assert tracing.run_of(known, spans) is spans[0]


def test_instrumenting_the_same_jobs_twice_is_refused(tracing: Tracing) -> None:
    tracing.instrument()
    with pytest.raises(ConfigurationError, match="traced already"):
        tracing.instrument()
    assert len(tracing.jobs.hooks.middlewares) == 1


def test_importing_sqla_jobs_and_running_a_worker_never_imports_opentelemetry(
    clean: Engine, migrated_url: str
) -> None:
    assert importlib.util.find_spec("opentelemetry.trace") is not None, "installed, not imported"
    script = textwrap.dedent(
        """
        import os, sys, threading
        from pydantic import BaseModel
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session
        import sqla_jobs, sqla_jobs.cli, sqla_jobs.testing
        from sqla_jobs.db.urls import sqlalchemy_url

        class Ping(BaseModel):
            n: int = 0

        jobs = sqla_jobs.Jobs()
        ran = threading.Event()
        jobs.register("ping", Ping, lambda args, ctx: ran.set())
        jobs.hooks.on_enqueue(lambda batch: batch.add_meta({"tag": "x"}))

        @jobs.hooks.middleware
        async def around(ctx, call_next):
            await call_next()

        url = os.environ["SQLA_JOBS_TEST_URL"]
        engine = create_engine(sqlalchemy_url(url))
        with Session(engine) as session:
            jobs.enqueue(session, Ping())
            session.commit()
        worker = sqla_jobs.Worker(jobs, url, poll_interval=0.1)
        thread = threading.Thread(
            target=worker.run_sync, kwargs={"install_signal_handlers": False}
        )
        thread.start()
        assert ran.wait(50), "the job did not run"
        worker.stop()
        thread.join(50)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
        assert not loaded, loaded
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "SQLA_JOBS_TEST_URL": migrated_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
