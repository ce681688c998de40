"""``sqla-jobs demo``: the design walkthrough as a story you can watch, on a real database.

The demo creates a throw-away database (``sqla_jobs_demo_<random>``) on the server of
``DATABASE_URL``, or of an embedded PostgreSQL when that is unset, and drops it at the end whatever
happens (error, Ctrl-C), so it never touches existing data. It migrates; enqueues jobs in the same
transaction as a business row (and rolls one back); runs a worker and prints what it does as it
happens (claims, failures with backoff, a dead job); freezes a worker mid-job so the reaper rescues
its job; prints the queue's stats; and measures ``FOR UPDATE`` against ``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from pydantic import BaseModel
from sqlalchemy import BigInteger, Engine, MetaData, Text, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ._config import WorkerSeams
from ._db import ENV_VAR, embedded_server, libpq_conninfo, redact, sqlalchemy_url, with_database
from .backoff import Backoff
from .context import JobContext
from .jobs import Jobs
from .migrate import upgrade
from .stats import collect, render
from .worker import Worker

#: Worker settings small enough that retries, lease expiry and reaping happen within seconds.
SLOTS = 4
LEASE = 3.0
HEARTBEAT = 1.0
POLL = 0.2
#: The race of step 8: connections, seconds per variant, jobs seeded, work done holding the lock.
RACE_CONNECTIONS = 4
RACE_SECONDS = 2.0
RACE_JOBS = 10_000
RACE_HOLD = 0.002
#: Upper bound on any single wait; the whole demo normally takes 12-20 s.
DEADLINE = 30.0

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

_WORKER_LOG = "sqla_jobs.worker"
_AT_PATH = re.compile(r" \(at [^()]*?([^/\\()]+:\d+)\)")


# -- the application of the story ---------------------------------------------------------------


class DemoBase(DeclarativeBase):
    """The demo application's own declarative base, on its own MetaData (never the package's)."""

    metadata = MetaData()


class Invoice(DemoBase):
    """A business row: the jobs about it are enqueued in the transaction that creates it."""

    __tablename__ = "demo_invoice"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer: Mapped[str] = mapped_column(Text)
    amount_cents: Mapped[int] = mapped_column(BigInteger)


class SendInvoice(BaseModel):
    """Email the invoice to one billing contact."""

    invoice_id: int
    to: str


class FlakyWebhook(BaseModel):
    """Tell a partner system; its endpoint answers 503 for the first ``outages`` calls."""

    invoice_id: int
    url: str
    outages: int


class BrokenReport(BaseModel):
    """Render a report from a template that does not exist: it can never succeed."""

    invoice_id: int
    template: str


class NightlyExport(BaseModel):
    """Export the invoice to the warehouse (an idempotent upsert)."""

    invoice_id: int


# -- printing -----------------------------------------------------------------------------------


class Console:
    """Prints the story: step titles, wrapped explanations, and timestamped events from any thread."""

    def __init__(self) -> None:
        self.started = time.time()
        self.t0 = self.started
        self._lock = threading.Lock()

    def say(self, text: str = "", indent: int = 3) -> None:
        with self._lock:
            print(textwrap.indent(text, " " * indent) if text else "", flush=True)

    def explain(self, text: str) -> None:
        self.say(textwrap.fill(" ".join(text.split()), width=96, break_on_hyphens=False))

    def step(self, number: int, title: str) -> None:
        self.say()
        self.say(f"[{number}/8] {title}", indent=0)
        self.say("-" * (len(title) + 6), indent=0)

    def restart_clock(self) -> None:
        self.t0 = time.time()

    def event(self, text: str, at: float | None = None) -> None:
        moment = (time.time() if at is None else at) - self.t0
        self.say(f"[t+{moment:5.2f}s] {text}", indent=5)


def _short_error(error: str) -> str:
    """``last_error`` with the handler's file shortened to its name (``(at demo.py:123)``)."""
    return _AT_PATH.sub(r" (at \1)", error)


def _no_location(error: str) -> str:
    return _AT_PATH.sub("", error)


class WorkerEvents(logging.Handler):
    """Prints the worker's log records (claims, failures, dead jobs, reaped leases) as events.

    ``clock_offset`` is the database clock minus this machine's, so that a ``run_at`` the database
    computed can be shown as a delay from the moment of the failure.
    """

    def __init__(self, console: Console, clock_offset: float) -> None:
        super().__init__(logging.DEBUG)
        self.console = console
        self.clock_offset = clock_offset

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.describe(record)
        except Exception:
            self.handleError(record)
            return
        if text:
            self.console.event(text, at=record.created)

    def describe(self, record: logging.LogRecord) -> str | None:
        event = getattr(record, "event", None)
        who = record.threadName or "?"
        who = who.removeprefix("sqla-jobs-leases-")
        args = record.args if isinstance(record.args, tuple) else ()
        if event in ("started", "stopped", "stopping"):
            return None  # the demo says these itself
        if event == "claimed" and len(args) >= 2:
            return f"{who} claimed job {args[0]} ({args[1]})"
        if event == "failed" and len(args) == 5:
            job_id, kind, attempt, run_at, error = args
            if not isinstance(run_at, datetime):
                return f"{who}: {_no_location(record.getMessage())}"
            delay = run_at.timestamp() - (record.created + self.clock_offset)
            return (
                f"{who}: job {job_id} ({kind}) attempt {attempt} failed: {_no_location(str(error))}"
                f"\n{' ' * 18}-> back to pending, due again in {delay:.2f}s (run_at set by the database)"
            )
        if event == "dead" and len(args) == 4:
            job_id, kind, attempt, error = args
            return (
                f"{who}: job {job_id} ({kind}) attempt {attempt} failed: {_no_location(str(error))}"
                f"\n{' ' * 18}-> DEAD: its failure budget is spent; it stays in the table for a human"
            )
        if event == "reaped":
            return f"{who} (reaper): {record.getMessage()}"
        return f"{who}: {_no_location(record.getMessage())}"


# -- plumbing -----------------------------------------------------------------------------------


class DemoFailed(Exception):
    """Something the demo waits for did not happen in time."""


class ServerUnusable(Exception):
    """The database server cannot be reached, or will not let the demo create its database."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class RunningWorker:
    """A :class:`Worker` running in a thread of its own, as it would in a process of its own."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=worker.name, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run_sync(install_signal_handlers=False)
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + DEADLINE
        while not self.worker.started.wait(0.05):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise DemoFailed(f"{self.worker.name} did not start: {self.error!r}")

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(DEADLINE)
        if self.error is not None:
            raise DemoFailed(f"{self.worker.name} failed: {self.error!r}") from self.error


class Sampler(threading.Thread):
    """Runs one query every ``interval`` seconds on a connection of its own; keeps the rows."""

    def __init__(
        self,
        conninfo: str,
        query: str,
        interval: float,
        on_row: Callable[[tuple[Any, ...]], None] | None = None,
    ) -> None:
        super().__init__(name="sqla-jobs-demo-sampler", daemon=True)
        self.conninfo = conninfo
        self.query = query
        self.interval = interval
        self.on_row = on_row
        self.rows: list[tuple[Any, ...]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self._stop_event.is_set():
                    row = conn.execute(self.query).fetchone()
                    if row is not None:
                        self.rows.append(tuple(row))
                        if self.on_row is not None:
                            self.on_row(tuple(row))
                    self._stop_event.wait(self.interval)
        except psycopg.Error:
            pass  # the database went away (Ctrl-C cleanup): nothing left to sample

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(DEADLINE)


@contextlib.contextmanager
def _sigint_deferred(*, reraise: bool) -> Iterator[None]:
    """Hold Ctrl-C back while something must not be cut in half (starting the embedded server,
    creating the database and registering its drop, cleaning up); then, with ``reraise``, act on it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and reraise:
        raise KeyboardInterrupt


def _wait_for(what: str, check: Callable[[], bool], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


# -- the story ----------------------------------------------------------------------------------


@dataclass
class RaceResult:
    """What one variant of the claim race measured."""

    label: str
    claims: int
    seconds: float
    select_seconds: float
    empty: int
    waiting_avg: float

    @property
    def rate(self) -> float:
        return self.claims / self.seconds if self.seconds else 0.0

    @property
    def lock_wait_seconds(self) -> float:
        """Connection-seconds spent waiting on a lock, from the sampled average."""
        return self.waiting_avg * self.seconds


class Demo:
    """The steps of the walkthrough, on the throw-away database at ``url``."""

    def __init__(self, console: Console, url: str) -> None:
        self.console = console
        self.url = url
        self.conninfo = libpq_conninfo(url)
        self.engine: Engine = create_engine(sqlalchemy_url(url), pool_size=2)
        self.observer: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(
            self.conninfo, autocommit=True
        )
        self.jobs = Jobs()
        self.running: list[RunningWorker] = []
        self.samplers: list[Sampler] = []
        self.log_handler: WorkerEvents | None = None
        self.log_state: tuple[int, bool] | None = None
        # Step 6: the frozen worker's handler hangs until released; the rescuer's export waits
        # until the demo has shown that the frozen worker's late write was fenced out.
        self.frozen_may_wake = threading.Event()
        self.rescue_may_finish = threading.Event()
        self.invoice_id = 0
        self._register_kinds()

    # -- kinds and handlers ----------------------------------------------------------------------

    def _register_kinds(self) -> None:
        self.jobs.register("send_invoice", SendInvoice, self.send_invoice)
        self.jobs.register(
            "flaky_webhook",
            FlakyWebhook,
            self.flaky_webhook,
            max_attempts=5,
            backoff=Backoff(base=1.5, cap_seconds=3),
        )
        self.jobs.register(
            "broken_report",
            BrokenReport,
            self.broken_report,
            max_attempts=2,
            backoff=Backoff(base=1, cap_seconds=0.5),
        )
        self.jobs.register("nightly_export", NightlyExport, self.nightly_export, max_crashes=3)

    async def send_invoice(self, p: SendInvoice, ctx: JobContext) -> None:
        await asyncio.sleep(0.10 + 0.02 * (ctx.job_id % 5))
        self.console.event(
            f"{ctx.worker}: job {ctx.job_id} emailed invoice #{p.invoice_id} to {p.to}"
        )

    async def flaky_webhook(self, p: FlakyWebhook, ctx: JobContext) -> None:
        await asyncio.sleep(0.05)
        if ctx.attempt <= p.outages:
            raise RuntimeError(f"POST {p.url} -> 503 Service Unavailable")
        self.console.event(
            f"{ctx.worker}: job {ctx.job_id} POST {p.url} -> 200 OK on attempt {ctx.attempt}"
        )

    async def broken_report(self, p: BrokenReport, ctx: JobContext) -> None:
        await asyncio.sleep(0.05)
        raise FileNotFoundError(f"report template {p.template!r} does not exist")

    def nightly_export(self, p: NightlyExport, ctx: JobContext) -> None:
        # A sync handler: the worker runs it in its thread pool.
        if ctx.worker == "worker-B":
            self.console.event(
                f"worker-B: job {ctx.job_id} export of invoice #{p.invoice_id} started ... "
                "and the worker freezes"
            )
            self.frozen_may_wake.wait(DEADLINE)
            self.console.event(
                f"worker-B: woke up; job {ctx.job_id} finished, reporting it done (too late)"
            )
            return
        self.console.event(
            f"{ctx.worker}: job {ctx.job_id} attempt {ctx.attempt} (crashes={ctx.crashes}): "
            "a rerun after a crash; the export is an upsert, so running it twice is safe"
        )
        self.rescue_may_finish.wait(DEADLINE)
        self.console.event(f"{ctx.worker}: job {ctx.job_id} exported invoice #{p.invoice_id}")

    # -- helpers ---------------------------------------------------------------------------------

    def value(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        row = self.observer.execute(query, params).fetchone()
        return None if row is None else row[0]

    def rows(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return list(self.observer.execute(query, params).fetchall())

    def worker(self, name: str, **options: Any) -> RunningWorker:
        settings: dict[str, Any] = {
            "concurrency": SLOTS,
            "lease": LEASE,
            "heartbeat": HEARTBEAT,
            "poll_interval": POLL,
            "shutdown_timeout": 5.0,
            "keep_history": True,
        }
        settings.update(options)
        running = RunningWorker(Worker(self.jobs, self.url, name=name, **settings))
        self.running.append(running)
        running.start()
        return running

    def stop(self, running: RunningWorker) -> None:
        running.stop()
        self.running.remove(running)

    def attach_log(self) -> None:
        # The database's clock minus ours, measured once (midpoint of a round trip).
        before = time.time()
        db_now = float(self.value("SELECT extract(epoch FROM clock_timestamp())"))
        offset = db_now - (before + time.time()) / 2
        logger = logging.getLogger(_WORKER_LOG)
        self.log_state = (logger.level, logger.propagate)
        self.log_handler = WorkerEvents(self.console, offset)
        logger.addHandler(self.log_handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False

    def detach_log(self) -> None:
        logger = logging.getLogger(_WORKER_LOG)
        if self.log_handler is not None:
            logger.removeHandler(self.log_handler)
            self.log_handler = None
        if self.log_state is not None:
            logger.setLevel(self.log_state[0])
            logger.propagate = self.log_state[1]
            self.log_state = None

    def close(self) -> None:
        """Stop everything this demo started (safe to call at any point, and twice)."""
        self.frozen_may_wake.set()
        self.rescue_may_finish.set()
        for running in reversed(self.running):
            with contextlib.suppress(Exception):
                running.stop()
        self.running.clear()
        for sampler in self.samplers:
            sampler.stop()
        self.samplers.clear()
        self.detach_log()
        with contextlib.suppress(Exception):
            self.observer.close()
        self.engine.dispose()

    # -- the steps -------------------------------------------------------------------------------

    def run(self) -> None:
        self.migrate()
        self.enqueue()
        self.attach_log()
        self.work()
        self.crash()
        self.detach_log()
        self.stats()
        self.race()

    def migrate(self) -> None:
        c = self.console
        c.step(2, "Migrate: one table and its partial indexes")
        c.explain(
            "sqla_jobs.migrate.upgrade(url) runs the Alembic revisions shipped in the package "
            "(branch 'sqla_jobs'); an application that has its own Alembic setup includes them "
            "instead."
        )
        upgrade(self.url)
        version = self.value("SELECT version_num FROM alembic_version")
        columns = [
            r[0]
            for r in self.rows(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'sqla_jobs_job' AND table_schema = current_schema() "
                "ORDER BY ordinal_position"
            )
        ]
        c.say(f"alembic_version: {version}")
        c.say(
            textwrap.fill(f"table sqla_jobs_job: {', '.join(columns)}", 96, subsequent_indent="  ")
        )
        for name, definition in self.rows(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE tablename = 'sqla_jobs_job' AND schemaname = current_schema() ORDER BY indexname"
        ):
            c.say(f"index {name} {str(definition).partition(' USING btree ')[2]}")
        c.explain(
            "state, run_at, attempts, the lease columns and last_error are the whole state machine. "
            "run_at is both the delay and the retry schedule; the claim index holds only pending "
            "rows, so it stays the size of the backlog, not of history."
        )

    def payloads(self, invoice_id: int) -> list[BaseModel]:
        send = [
            SendInvoice(invoice_id=invoice_id, to=f"billing+{i}@acme.example") for i in range(1, 17)
        ]
        hooks = [
            FlakyWebhook(invoice_id=invoice_id, url="https://erp.acme.example/hooks", outages=1),
            FlakyWebhook(invoice_id=invoice_id, url="https://crm.acme.example/hooks", outages=2),
            FlakyWebhook(invoice_id=invoice_id, url="https://ledger.acme.example/hooks", outages=1),
        ]
        report = BrokenReport(invoice_id=invoice_id, template="q3-summary.xlsx")
        # Interleaved, so the first claims already mix kinds: 16 + 3 + 1 = 20 jobs.
        return [
            *send[:3],
            hooks[0],
            *send[3:6],
            report,
            *send[6:9],
            hooks[1],
            *send[9:12],
            hooks[2],
            *send[12:],
        ]

    def enqueue(self) -> None:
        c = self.console
        c.step(3, "A business row and its jobs, in ONE transaction")
        DemoBase.metadata.create_all(self.engine)
        c.explain(
            "The demo application has its own ORM table, demo_invoice. In one "
            "`with Session(engine) as s, s.begin():` it adds an invoice and enqueues 20 jobs with "
            "jobs.enqueue_many(s, [...]), one INSERT. Nothing is committed until the block ends."
        )
        with Session(self.engine) as s, s.begin():
            invoice = Invoice(customer="ACME Corp", amount_cents=129_900)
            s.add(invoice)
            s.flush()
            self.invoice_id = invoice.id
            ids = self.jobs.enqueue_many(s, self.payloads(invoice.id))
            outside = self.value("SELECT count(*) FROM sqla_jobs_job")
            c.say(
                f"inside the transaction: invoice #{invoice.id} and jobs {ids[0]}..{ids[-1]} exist; "
                f"another connection sees {outside} jobs"
            )
        kinds = self.rows("SELECT kind, count(*) FROM sqla_jobs_job GROUP BY kind ORDER BY 2 DESC")
        c.say(
            f"committed: another connection now sees {sum(n for _, n in kinds)} pending jobs: "
            + ", ".join(f"{n} {k}" for k, n in kinds)
        )
        c.say("kinds: send_invoice (ok, 100-180 ms), flaky_webhook (503 for the first 1-2 calls,")
        c.say(
            "       Backoff(base=1.5, cap_seconds=3)), broken_report (always raises, max_attempts=2)"
        )

        with Session(self.engine) as s:
            tx = s.begin()
            other = Invoice(customer="Globex", amount_cents=4_200)
            s.add(other)
            s.flush()
            job = self.jobs.enqueue(s, SendInvoice(invoice_id=other.id, to="ap@globex.example"))
            job_id, other_id = job.id, other.id
            tx.rollback()
        left_jobs = self.value("SELECT count(*) FROM sqla_jobs_job WHERE id = %s", (job_id,))
        left_invoices = self.value("SELECT count(*) FROM demo_invoice WHERE id = %s", (other_id,))
        c.say(
            f"rolled back: a second transaction added invoice #{other_id} and job {job_id}, then "
            f"rolled back -> {left_invoices} invoice, {left_jobs} job left"
        )
        c.explain(
            "The job exists if and only if the business row does: no dual write, no outbox. The "
            "wake-up NOTIFY is sent by Postgres only at commit."
        )
        c.say()
        c.say(render(collect(self.url)))

    def work(self) -> None:
        c = self.console
        c.step(4, f"A worker with {SLOTS} slots: claims without waiting")
        c.explain(
            f"Worker(jobs, url, concurrency={SLOTS}, poll_interval={POLL}, lease={LEASE:g}, "
            f"heartbeat={HEARTBEAT:g}, keep_history=True) runs in a background thread. Its fetch "
            f"loop claims up to {SLOTS} jobs in ONE statement (UPDATE ... FROM a MATERIALIZED "
            "SELECT ... FOR UPDATE SKIP LOCKED) and runs them as asyncio tasks. Finished jobs are "
            "deleted (kept in sqla_jobs_history here, so we can look). A sampler watches "
            "pg_stat_activity for connections waiting on a lock."
        )
        peak = {"running": 0}

        def on_sample(row: tuple[Any, ...]) -> None:
            waiting, running = int(row[0]), int(row[1])
            if running >= SLOTS > peak["running"]:
                c.event(
                    f"db: {running} jobs running at once, {waiting} connections waiting on a lock"
                )
            peak["running"] = max(peak["running"], running)

        sampler = Sampler(
            self.conninfo,
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'), "
            "(SELECT count(*) FROM sqla_jobs_job WHERE state = 'running')",
            0.02,
            on_sample,
        )
        self.samplers.append(sampler)
        c.say()
        c.restart_clock()
        sampler.start()
        worker = self.worker("worker-A")
        c.event(f"worker-A started ({SLOTS} slots, LISTENing for NOTIFY, polling every {POLL}s)")
        _wait_for(
            "the 20 jobs to finish",
            lambda: (
                self.value(
                    "SELECT count(*) FROM sqla_jobs_job WHERE state IN ('pending', 'running')"
                )
                == 0
            ),
        )
        sampler.stop()
        self.stop(worker)
        counts = worker.worker.counts
        c.event(
            f"worker-A stopped gracefully: claimed {counts['claimed']}, done {counts['done']}, "
            f"failed {counts['failed']}, dead {counts['dead']}"
        )
        waits = [int(r[0]) for r in sampler.rows]
        c.say()
        c.say(
            f"sampled every 20 ms ({len(waits)} samples): at most {peak['running']} jobs running at "
            f"once; samples with a connection waiting on a lock: {sum(1 for w in waits if w)}"
        )
        if peak["running"] > SLOTS:
            c.explain(
                f"(More than {SLOTS}: a slot takes its next job as soon as its handler returns, "
                "while the finished job's row stays 'running' until the fetch loop writes the "
                "outcome, a few milliseconds later.)"
            )
        self.outcomes()

    def outcomes(self) -> None:
        c = self.console
        c.step(5, "Retries with backoff, and a dead job")
        c.explain(
            "Above, each failure went through ONE fail statement: the database itself chose "
            "between 'pending again, run_at = now() + least(base ^ failures, cap)' and 'dead', "
            "from the row's own counters (flaky_webhook: 1.5 s, then 2.25 s). Attempts are "
            "counted at claim time. What the tables hold now:"
        )
        rows = self.rows(
            "SELECT kind, 'done' AS outcome, count(*), sum(attempts), NULL FROM sqla_jobs_history "
            "GROUP BY kind "
            "UNION ALL "
            "SELECT kind, state, count(*), sum(attempts), max(last_error) FROM sqla_jobs_job "
            "GROUP BY kind, state "
            "ORDER BY 1, 2"
        )
        c.say(f"{'kind':<15} {'outcome':<8} {'jobs':>4} {'attempts':>9}  last_error")
        for kind, outcome, jobs, attempts, error in rows:
            line = f"{kind:<15} {outcome:<8} {jobs:>4} {attempts:>9}  {_short_error(error or '')}"
            c.say(line.rstrip())
        c.explain(
            "Every job ended as designed: send_invoice done on attempt 1, flaky_webhook done after "
            "its outages, broken_report dead after max_attempts=2 with its last_error kept for a "
            "human (pending again only if someone resets it)."
        )

    def crash(self) -> None:
        c = self.console
        c.step(6, "A worker crash, rescued by the reaper")
        c.explain(
            f"worker-B (1 slot) claims a nightly_export job, then freezes: we set its lease "
            "keeper's `heartbeats_paused` test seam, so it stops heartbeating, exactly what a killed process, "
            f"a long GC pause or a suspended VM looks like from the database. Its lease is "
            f"{LEASE:g}s. worker-C starts with reap_interval=0.5 and rescues the job."
        )
        c.say()
        c.restart_clock()
        paused = threading.Event()
        paused.set()
        frozen = self.worker(
            "worker-B",
            concurrency=1,
            reap_interval=3600.0,
            seams=WorkerSeams(heartbeats_paused=paused),
        )
        c.event("worker-B started; its heartbeats are frozen")
        with Session(self.engine) as s, s.begin():
            job_id = self.jobs.enqueue(s, NightlyExport(invoice_id=self.invoice_id)).id

        def state() -> tuple[Any, ...]:
            row = self.observer.execute(
                "SELECT state, locked_by, crashes, attempts, "
                "extract(epoch FROM lease_expires_at - now()) FROM sqla_jobs_job WHERE id = %s",
                (job_id,),
            ).fetchone()
            return tuple(row) if row is not None else ("gone", None, None, None, None)

        _wait_for("worker-B to claim the export", lambda: state()[1] == "worker-B")
        rescuer = self.worker("worker-C", concurrency=2, reap_interval=0.5)
        c.event("worker-C started (reaps expired leases every 0.5 s)")
        shown = -1
        deadline = time.monotonic() + DEADLINE
        while (current := state())[0] == "running" and current[1] == "worker-B":
            left = current[4]
            if left is not None and int(left) != shown and left > 0:
                shown = int(left)
                c.event(
                    f"db: job {job_id} running on worker-B, no heartbeat, lease expires in "
                    f"{float(left):.1f}s"
                )
            if time.monotonic() > deadline:
                raise DemoFailed("the frozen worker's lease was never reaped")
            time.sleep(0.05)
        _wait_for("worker-C to claim the rescued job", lambda: state()[1] == "worker-C")
        current = state()
        c.event(
            f"db: job {job_id} {current[0]} on worker-C, attempts={current[3]}, "
            f"crashes={current[2]}"
        )
        # Wake the frozen worker while the rescuer still runs the job: its completion must not
        # delete the row the rescuer now owns.
        frozen.worker.stop()
        self.frozen_may_wake.set()
        self.stop(frozen)
        current = state()
        c.event(
            f"db: worker-B stopped; job {job_id} is still {current[0]} on {current[1]}: "
            "worker-B's DELETE was fenced on its old lease token and matched nothing"
        )
        self.rescue_may_finish.set()
        _wait_for("the rescued job to finish", lambda: state()[0] == "gone")
        self.stop(rescuer)
        done = self.rows("SELECT attempts, crashes FROM sqla_jobs_history WHERE id = %s", (job_id,))
        if not done:
            raise DemoFailed(f"job {job_id} is missing from sqla_jobs_history")
        c.say()
        c.say(
            f"sqla_jobs_history: job {job_id} done once, by worker-C, with attempts={done[0][0]} "
            f"and crashes={done[0][1]}"
        )
        c.explain(
            "Delivery is at-least-once: the export ran twice (the frozen run and the rescue), so "
            "handlers must be idempotent; ctx.attempt > 1 or ctx.crashes > 0 tells a handler it is "
            "a rerun. Crashes are counted apart from failures, so a drained node does not spend a "
            "job's failure budget (max_crashes bounds them)."
        )

    def stats(self) -> None:
        c = self.console
        c.step(7, "The one dashboard that matters")
        c.explain(
            "sqla_jobs.stats.collect/render (also `sqla-jobs stats`): jobs by state and the age of "
            "the oldest due pending job, the true queue latency. If it climbs while claims stay "
            "flat you are out of workers; if dead climbs, a handler is broken."
        )
        c.say()
        c.say(render(collect(self.url)))
        done = self.value("SELECT count(*) FROM sqla_jobs_history")
        c.say(f"sqla_jobs_history: {done} finished jobs")
        c.explain(
            "The honest cost: every job wrote at least three row versions (insert, claim, delete), "
            "so the queue table makes dead tuples as fast as it runs jobs, and autovacuum, not "
            "SKIP LOCKED, sets the ceiling. The migration tunes the table's autovacuum settings; "
            "watch n_dead_tup and the last autovacuum (the line above), and the oldest open "
            "transaction, which stops vacuum from removing them."
        )

    def race(self) -> None:
        c = self.console
        c.step(8, "Measured: FOR UPDATE vs FOR UPDATE SKIP LOCKED")
        c.explain(
            f"The version people write first, and the fix, side by side. {RACE_CONNECTIONS} "
            f"connections, {RACE_SECONDS:g} s each, over {RACE_JOBS:,} pending jobs in a plain demo "
            "table; each claim is one transaction: SELECT id ... WHERE state = 'pending' ORDER BY "
            "run_at LIMIT 1 FOR UPDATE [SKIP LOCKED]; UPDATE ... SET state = 'running'; "
            f"{RACE_HOLD * 1000:g} ms of work holding the lock; COMMIT."
        )
        with self.observer.transaction():
            self.observer.execute(
                "CREATE TABLE demo_race_job (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                "state text NOT NULL DEFAULT 'pending', run_at timestamptz NOT NULL DEFAULT now(), "
                "claimed_by int)"
            )
            self.observer.execute(
                "CREATE INDEX demo_race_job_ready_idx ON demo_race_job (run_at, id) "
                "WHERE state = 'pending'"
            )
        results = [self.race_one(False), self.race_one(True)]
        self.observer.execute("DROP TABLE demo_race_job")
        plain, skip = results
        ratio = skip.rate / plain.rate if plain.rate else float("inf")
        c.say()
        c.say(f"{'':<34} {'FOR UPDATE':>12} {'SKIP LOCKED':>12}")
        for label, a, b in (
            ("jobs claimed", f"{plain.claims:,}", f"{skip.claims:,}"),
            ("claims per second", f"{plain.rate:,.0f}", f"{skip.rate:,.0f}"),
            (
                "connections waiting on a lock",
                f"{plain.waiting_avg:.1f} of {RACE_CONNECTIONS}",
                f"{skip.waiting_avg:.1f} of {RACE_CONNECTIONS}",
            ),
            (
                "time waiting on locks, total",
                f"{plain.lock_wait_seconds:.2f} s",
                f"{skip.lock_wait_seconds:.2f} s",
            ),
            (
                "time inside the SELECT, summed",
                f"{plain.select_seconds:.2f} s",
                f"{skip.select_seconds:.2f} s",
            ),
            (
                "time inside the SELECT, per claim",
                f"{plain.select_seconds / max(plain.claims, 1) * 1000:.2f} ms",
                f"{skip.select_seconds / max(skip.claims, 1) * 1000:.2f} ms",
            ),
            ("SELECTs that came back empty", f"{plain.empty}", f"{skip.empty}"),
        ):
            c.say(f"{label:<34} {a:>12} {b:>12}")
        c.say()
        waited = (
            "none of its connections was ever seen waiting on a lock"
            if skip.waiting_avg == 0
            else f"on average {skip.waiting_avg:.1f} of its connections were waiting on a lock"
        )
        c.explain(f"SKIP LOCKED claimed {ratio:.1f}x as many jobs per second, and {waited}.")
        c.explain(
            "Without SKIP LOCKED every connection picks the same oldest row and queues behind its "
            "lock; when the holder commits, the others re-check the row, find it no longer pending "
            "and move on to the next one, where they queue again: one claim per lock hold, however "
            "many workers. With SKIP LOCKED each connection steps over locked rows and takes the "
            "next one; the price is that ORDER BY becomes advisory under load. (The waiting "
            "column is sampled from pg_stat_activity every 20 ms. The exact ratio depends on the "
            "machine: the connections share its CPUs, and every commit waits for its WAL flush.)"
        )

    def race_one(self, skip_locked: bool) -> RaceResult:
        label = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
        self.observer.execute("TRUNCATE demo_race_job")
        self.observer.execute(
            "INSERT INTO demo_race_job (state) SELECT 'pending' FROM generate_series(1, %s)",
            (RACE_JOBS,),
        )
        self.observer.execute("ANALYZE demo_race_job")
        claim = (
            "SELECT id FROM demo_race_job WHERE state = 'pending' AND run_at <= now() "
            "ORDER BY run_at, id LIMIT 1 "
            + ("FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE")
        )
        take = "UPDATE demo_race_job SET state = 'running', claimed_by = %s WHERE id = %s"
        stop = threading.Event()
        start = threading.Barrier(RACE_CONNECTIONS + 1)
        totals: list[tuple[int, float, int, float]] = []
        lock = threading.Lock()

        def claimer(n: int) -> None:
            claims, in_select, empty, ended = 0, 0.0, 0, 0.0
            try:
                with psycopg.connect(self.conninfo) as conn:
                    with contextlib.suppress(threading.BrokenBarrierError):
                        start.wait(DEADLINE)
                    while not stop.is_set():
                        began = time.perf_counter()
                        row = conn.execute(claim).fetchone()
                        in_select += time.perf_counter() - began
                        if row is None:
                            conn.rollback()
                            left = conn.execute(
                                "SELECT count(*) FROM demo_race_job WHERE state = 'pending'"
                            ).fetchone()
                            conn.rollback()
                            if left is None or left[0] == 0:
                                break
                            empty += 1
                            continue
                        conn.execute(take, (n, row[0]))
                        time.sleep(RACE_HOLD)
                        conn.commit()
                        claims += 1
                        ended = time.perf_counter()
            except psycopg.Error:
                pass  # Ctrl-C cleanup dropped the database under us
            with lock:
                totals.append((claims, in_select, empty, ended))

        sampler = Sampler(
            self.conninfo,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'",
            0.02,
        )
        self.samplers.append(sampler)
        threads = [
            threading.Thread(target=claimer, args=(n,), name=f"race-{n}", daemon=True)
            for n in range(RACE_CONNECTIONS)
        ]
        for t in threads:
            t.start()
        try:
            start.wait(DEADLINE)
            began = time.perf_counter()
            sampler.start()
            stop.wait(RACE_SECONDS)
        finally:
            stop.set()
            for t in threads:
                t.join(DEADLINE)
            sampler.stop()
            self.samplers.remove(sampler)
        last = max((t[3] for t in totals), default=began)
        seconds = min(RACE_SECONDS, last - began) if last > began else RACE_SECONDS
        waiting = [int(r[0]) for r in sampler.rows]
        result = RaceResult(
            label=label,
            claims=sum(t[0] for t in totals),
            seconds=seconds,
            select_seconds=sum(t[1] for t in totals),
            empty=sum(t[2] for t in totals),
            waiting_avg=sum(waiting) / len(waiting) if waiting else 0.0,
        )
        self.console.say(
            f"{label:<23} {result.claims:>6,} claims in {result.seconds:.1f} s "
            f"({result.rate:,.0f}/s)"
        )
        return result


# -- entry point --------------------------------------------------------------------------------


@contextlib.contextmanager
def _embedded(console: Console) -> Iterator[str]:
    started = False
    try:
        with embedded_server() as url:
            started = True
            yield url
    finally:
        if started:
            console.say("stopped the embedded PostgreSQL and deleted its data directory", indent=0)


def _server(console: Console, stack: contextlib.ExitStack, database_url: str | None) -> str:
    url = database_url or os.environ.get(ENV_VAR)
    if url:
        source = "--database-url" if database_url else ENV_VAR
        console.say(f"server: {redact(url)} (from {source})")
        return url
    console.say(f"{ENV_VAR} is not set: starting an embedded PostgreSQL (a pip wheel) ...")
    # A Ctrl-C in the middle of the server's start would leave it running: let it finish first.
    with _sigint_deferred(reraise=True):
        url = stack.enter_context(_embedded(console))
    console.say(f"server: {redact(url)} (embedded, stopped at the end)")
    return url


def _create_database(console: Console, stack: contextlib.ExitStack, server: str) -> str:
    name = f"sqla_jobs_demo_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(libpq_conninfo(server), autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ServerUnusable(
            f"cannot reach the database at {redact(server)}: {first}", EXIT_UNREACHABLE
        ) from None

    def drop() -> None:
        with psycopg.connect(libpq_conninfo(server), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        console.say(f"dropped the demo database {name}", indent=0)

    with admin, _sigint_deferred(reraise=True):
        version = admin.execute("SHOW server_version").fetchone()
        try:
            admin.execute(f'CREATE DATABASE "{name}"')
        except psycopg.errors.InsufficientPrivilege:
            raise ServerUnusable(
                f"the demo creates (and then drops) a database of its own, and the user of "
                f"{redact(server)} may not create databases: use a role with CREATEDB, or unset "
                f"{ENV_VAR} to run on an embedded PostgreSQL",
                EXIT_USAGE,
            ) from None
        stack.callback(drop)
    console.say(f"PostgreSQL {version[0] if version else '?'}")
    console.say(
        f"created the throw-away database {name}; it is dropped at the end whatever happens, "
        "so the demo never touches your data"
    )
    return with_database(server, name)


def main(database_url: str | None = None) -> int:
    """Run the guided demo; return the exit code (0: every step behaved as designed).

    The database server is ``database_url``, else ``DATABASE_URL``, else an embedded PostgreSQL
    started for the demo. All the work happens in a database created for the run and dropped at
    the end, together with every worker thread and the embedded server, on success, error or
    Ctrl-C.
    """
    console = Console()
    console.say("sqla-jobs demo: a Postgres job queue in one table, on a real database", indent=0)
    stack = contextlib.ExitStack()
    try:
        try:
            console.step(1, "The database")
            server = _server(console, stack, database_url)
            url = _create_database(console, stack, server)
            demo = Demo(console, url)
            stack.callback(demo.close)
            demo.run()
        finally:
            console.say()
            with _sigint_deferred(reraise=False):
                stack.close()
    except KeyboardInterrupt:
        print("sqla-jobs demo: interrupted; everything it started is stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ServerUnusable as exc:
        print(f"sqla-jobs demo: {exc}", file=sys.stderr)
        return exc.code
    except Exception:
        traceback.print_exc()
        print(
            "sqla-jobs demo: failed (see above); everything it started is stopped", file=sys.stderr
        )
        return EXIT_ERROR
    console.say(f"demo finished in {time.time() - console.started:.1f} s", indent=0)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
