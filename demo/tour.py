"""The walkthrough's state: its engines, its workers and samplers, and how it stops them.

Every read of the queue goes through the package's models on an engine that translates their
schema to ``Jobs(schema=...)``'s, as the package's own statements do, so the story reads the
tables the worker writes wherever they live. The application's own table is read on the plain
engine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Engine,
    Executable,
    and_,
    column,
    create_engine,
    func,
    literal,
    not_,
    select,
    table,
)

from sqla_jobs import Jobs
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.worker.facade import Worker

from .console import Console
from .events import AttachedEvents
from .invoices import Handlers
from .threads import RunningWorker, Sampler

#: Worker settings small enough that retries, lease expiry and reaping happen within seconds.
SLOTS = 4
LEASE = 3.0
HEARTBEAT = 1.0
POLL = 0.2

#: The server's view of its sessions (an explicit schema: never translated).
_ACTIVITY = table(
    "pg_stat_activity",
    column("datname"),
    column("wait_event_type"),
    column("wait_event"),
    column("query"),
    schema="pg_catalog",
)
#: What ``SKIP LOCKED`` spares a claim: waiting for a row another transaction holds.
ROW_LOCKS = ("transactionid", "tuple")
_HERE = _ACTIVITY.c.datname == func.current_database()
_LOCK = _ACTIVITY.c.wait_event_type == "Lock"
#: A claim: every claim statement, and no other, sets its rows running.
_CLAIMING = _ACTIVITY.c.query.contains("SET state='running'")
_CLAIM_ON_A_ROW = and_(_HERE, _LOCK, _ACTIVITY.c.wait_event.in_(ROW_LOCKS), _CLAIMING)
#: Claims of this database waiting on a row lock, now.
CLAIMS_WAITING = (
    select(func.count()).select_from(_ACTIVITY).where(_CLAIM_ON_A_ROW).scalar_subquery()
)
#: Every other lock wait of this database now, as "event: the statement's start", or None: an
#: outcome write waiting a moment for the heartbeat's renewal of its row, a table growing.
OTHER_WAITS = (
    select(
        func.string_agg(
            _ACTIVITY.c.wait_event
            + literal(": ")
            + func.left(func.regexp_replace(_ACTIVITY.c.query, r"\s+", " ", "g"), 40),
            literal("; "),
        )
    )
    .where(_HERE, _LOCK, not_(_CLAIM_ON_A_ROW))
    .scalar_subquery()
)


class Demo:
    """The walkthrough on the throw-away database at ``url``, the queue in ``schema`` (None: the
    search_path's). :meth:`close` stops whatever it started."""

    def __init__(self, console: Console, url: str, schema: str | None = None) -> None:
        self.console = console
        self.url = url
        self.schema = schema
        self.jobs = Jobs(schema=schema)
        self.handlers = Handlers(console)
        self.handlers.register(self.jobs)
        #: The application's engine: its sessions, its own table.
        self.app: Engine = create_engine(sqlalchemy_url(url), pool_size=2)
        #: Reads of the package's tables, in the queue's schema.
        self.queue: Engine = (
            self.app
            if schema is None
            else self.app.execution_options(schema_translate_map={None: schema})
        )
        self.running: list[RunningWorker] = []
        self.samplers: list[Sampler] = []
        self.events: AttachedEvents | None = None
        self.invoice_id = 0

    # -- helpers ---------------------------------------------------------------------------------

    def value(self, statement: Executable) -> Any:
        """The first column of the first row of ``statement`` on the queue's engine."""
        with self.queue.connect() as conn:
            return conn.execute(statement).scalar()

    def rows(self, statement: Executable) -> list[Sequence[Any]]:
        """The rows of ``statement`` on the queue's engine."""
        with self.queue.connect() as conn:
            return [tuple(r) for r in conn.execute(statement)]

    def worker(self, name: str, **options: Any) -> RunningWorker:
        """Start a worker named ``name`` in a thread; the demo's settings, then ``options``."""
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
        """Stop a worker :meth:`worker` started."""
        running.stop()
        self.running.remove(running)

    def attach_log(self) -> None:
        """Show the worker's log records as events, from now on."""
        # The database's clock minus ours, measured once (midpoint of a round trip).
        before = time.time()
        db_now = float(self.value(select(func.extract("epoch", func.clock_timestamp()))))
        offset = db_now - (before + time.time()) / 2
        self.events = AttachedEvents(self.console, offset)
        self.events.attach()

    def detach_log(self) -> None:
        """Stop showing the worker's records (safe to call twice)."""
        if self.events is not None:
            self.events.detach()
            self.events = None

    def close(self) -> None:
        """Stop everything this demo started (safe to call at any point, and twice)."""
        self.handlers.release()
        for running in reversed(self.running):
            with contextlib.suppress(Exception):
                running.stop()
        self.running.clear()
        for sampler in self.samplers:
            sampler.stop()
        self.samplers.clear()
        self.detach_log()
        self.app.dispose()
