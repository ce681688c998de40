"""The worker: claim a batch -> run handlers -> write outcomes, with leases, wakeups and a graceful
stop.

Where a job goes, from claim to outcome:

1. :mod:`~sqla_jobs.worker.fetch` decides when to claim, and :mod:`~sqla_jobs.worker.lanes` claims (with the
   previous batch's outcomes, in one round trip) into the :mod:`~sqla_jobs.worker.holdings`. An idle
   worker hands its next claim to the listener's thread (:mod:`~sqla_jobs.worker.handoff`), which makes
   it the moment a NOTIFY arrives (:mod:`~sqla_jobs.worker.listener`); polling every ``poll_interval``
   is the floor.
2. :mod:`~sqla_jobs.worker.slots` runs each held job's handler; :mod:`~sqla_jobs._outcome` decides how
   the run ended.
3. :mod:`~sqla_jobs.worker.writes` writes the outcome, fenced on the lease, on the next round trip.

Meanwhile :mod:`~sqla_jobs.worker.leases` renews the leases of everything held, and
:mod:`~sqla_jobs.worker.reaper` puts the jobs of dead workers back in the queue, and
:mod:`~sqla_jobs.worker.pruner` deletes finished jobs past their retention. Delivery is
at-least-once: a job whose worker dies runs again after its lease expires, so handlers must be
idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqla_jobs._outcome import HandlerTimeout
from sqla_jobs.context import ClaimedJob
from sqla_jobs.db.connections import Connector
from sqla_jobs.db.driver_logs import quieted
from sqla_jobs.db.urls import hosts_without_primary, libpq_conninfo
from sqla_jobs.jobs import Jobs
from sqla_jobs.periodic.scheduler import Scheduler
from sqla_jobs.retention import DEFAULT_RETENTION, Retention
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.config import WorkerConfig, WorkerSeams, check_config
from sqla_jobs.worker.handoff import Handoff
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.lanes import Lanes
from sqla_jobs.worker.leases import LeaseKeeper
from sqla_jobs.worker.listener import Listener
from sqla_jobs.worker.monitor import Monitor
from sqla_jobs.worker.parts import Parts, build_parts
from sqla_jobs.worker.prefetch import Prefetch
from sqla_jobs.worker.pruner import Pruner
from sqla_jobs.worker.reaper import Reaper
from sqla_jobs.worker.services import start_threads, stop_thread
from sqla_jobs.worker.session_runs import AnyMaker, SessionRuns
from sqla_jobs.worker.shutdown import shutdown
from sqla_jobs.worker.signals import EXIT_FORCED, StopSignals
from sqla_jobs.worker.startup import StartChecks, Startup, log_started
from sqla_jobs.worker.wakeups import Wakeups

if TYPE_CHECKING:
    from sqla_jobs.observe.metrics import Metrics

__all__ = ["EXIT_FORCED", "EXIT_STUCK", "HandlerTimeout", "Worker"]

log = logging.getLogger("sqla_jobs.worker")

#: Exit code of a worker that stopped because a sync handler was stuck far past its timeout.
EXIT_STUCK = 5


class Worker:
    """Runs the handlers of ``jobs`` for jobs in ``queues`` (default: the queues of the kinds that
    have handlers).

    ``database_url`` is the application's own URL, in any of SQLAlchemy's PostgreSQL forms
    (``postgresql://``, ``postgres://``, ``postgresql+psycopg2://``, ``+asyncpg``, ``+pg8000``,
    ``+psycopg``): the worker connects with psycopg 3 whatever driver it names, and never imports
    that driver. The driver's query parameters are translated into libpq's (asyncpg's
    ``ssl=require`` is ``sslmode=require``), its client-side tuning is dropped (asyncpg's
    ``prepared_statement_cache_size``), and a parameter with no libpq equivalent raises
    :class:`~sqla_jobs.DatabaseURLError` naming it, before anything connects.

    ``concurrency`` handlers run at once. A claimed job holds a lease of ``lease`` seconds, renewed
    every ``heartbeat`` (default a third of the lease) while it runs; an expired lease is reaped
    (every ``reap_interval``, default half the lease up to 30 s) by any worker and the job runs
    again (at-least-once). Up to ``prefetch`` claimed jobs wait locally for a free slot (default:
    automatic while handlers average under 50 ms), leased like running jobs, given back if they
    cannot start within a second, and at shutdown. ``listen=False`` is poll-only mode, for
    PgBouncer in transaction pooling; ``prepared_statements=False`` for PgBouncer before 1.21.

    A sync handler past its kind's timeout keeps its job ``running`` until it returns, then fails
    as timed out; one still running ``stuck_grace`` seconds past its timeout stops the worker,
    which exits with :data:`EXIT_STUCK` for a supervisor to restart it. :meth:`stop` (or SIGTERM
    or SIGINT under :meth:`run_sync`) stops claiming at once, lets running handlers finish for up
    to ``shutdown_timeout`` seconds, and gives back the jobs of those that did not (not counted as
    a failure or a crash; the next run sees ``ctx.interruptions``).

    Finished jobs are pruned as ``retention`` says (default :class:`Retention`: completed and
    cancelled jobs kept 24 hours, dead ones 7 days; None: never), every ``prune_interval`` seconds
    by one worker at a time across all machines (:mod:`~sqla_jobs.worker.pruner`).

    A handler that takes a third argument gets a Session whose writes commit in one transaction
    with its job's completion, fenced on the lease (:mod:`~sqla_jobs.worker.session_runs`): from
    ``sessionmaker`` (a ``sessionmaker``, or an ``async_sessionmaker`` for async handlers; without
    one, or for the other flavour, a maker on ``database_url``). A handler that holds that
    transaction open past ``long_transaction`` seconds is logged: it holds back vacuum.

    With ``schedules`` (default) the worker also enqueues the ticks of the schedules declared
    with :meth:`Jobs.periodic <sqla_jobs.Jobs.periodic>`, each tick once across every worker
    (:mod:`~sqla_jobs.periodic.scheduler`); its role then needs the enqueuer's grants.

    Every worker registers itself in ``sqla_jobs_worker`` while it runs (``sqla-jobs workers``)
    and, with ``throughput`` (default), adds what it finished to the per-minute counts of
    ``sqla_jobs_throughput`` at each reap (the dashboard's chart; :mod:`~sqla_jobs.observe.tally`). With ``metrics`` (a :class:`sqla_jobs.metrics.Metrics`, the ``metrics`` extra) it counts and
    times its runs there, serves them on the metrics' port with ``/healthz``, and takes its turn
    at sampling the queues' depth.
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
        stuck_grace: float = 60.0,
        retention: Retention | None = DEFAULT_RETENTION,
        prune_interval: float = 300.0,
        schedules: bool = True,
        sessionmaker: AnyMaker | None = None,
        long_transaction: float = 60.0,
        metrics: Metrics | None = None,
        throughput: bool = True,
        seams: WorkerSeams | None = None,
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
            stuck_grace=stuck_grace,
            retention=retention,
            prune_interval=prune_interval,
            schedules=schedules,
            long_transaction=long_transaction,
        )
        check_config(self.config, jobs)
        if (hosts := hosts_without_primary(database_url)) is not None:
            log.warning("%s", hosts, extra={"event": "url_hosts"})
        self.jobs = jobs
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._seams = seams or WorkerSeams()
        # psycopg prepares a statement server-side after its 5th run; None: never.
        threshold = 5 if prepared_statements else None
        make = self._seams.connector or Connector
        self.connector = make(libpq_conninfo(database_url), self.name, threshold)
        #: Its registry row, its throughput counts and its metrics if any.
        self.monitor = Monitor(
            jobs=jobs,
            config=self.config,
            name=self.name,
            connector=self.connector,
            metrics=metrics,
            throughput=throughput,
        )
        # With metrics or the tally, the claims also return when each job became due.
        self._sql = WorkerSQL(jobs.schema, timed=self.monitor.timed)
        # Keyed claims cost an extra transaction per round: only workers that may see keyed jobs
        # (a handled kind with a concurrency limit) run them.
        self._keyed = any(
            k.options.concurrency_limit is not None
            for k in jobs
            if k.handler is not None and k.options.queue in self.config.queues
        )
        #: The runs of handlers that take a Session (None: this worker runs none).
        self.sessions: SessionRuns | None = None
        if any(k.wants_session and k.options.queue in self.config.queues for k in jobs):
            self.sessions = SessionRuns(
                url=database_url,
                schema=jobs.schema,
                keep_history=keep_history,
                maker=sessionmaker,
                pool_size=concurrency,
                warn_after=long_transaction,
            )
        self.holdings = Holdings()
        self.holdings.set_columns(meta=False, timed=self.monitor.timed)
        self.prefetch = Prefetch(concurrency, prefetch, batch_size)
        #: Counters for tests, benchmarks and the final log line.
        self.counts = dict.fromkeys(
            ("claimed", "done", "failed", "dead", "released", "snoozed", "cancelled"), 0
        )
        self.started = threading.Event()
        self.leases: LeaseKeeper | None = None
        self.reaper: Reaper | None = None
        self.pruner: Pruner | None = None
        self.listener: Listener | None = None
        self.scheduler: Scheduler | None = None
        self.lanes: Lanes | None = None
        self.handoff: Handoff | None = None
        self.wakeups: Wakeups | None = None
        self._stop_requested = False
        self._exit_code = 0

    # -- control ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming now, let running handlers finish; safe from any thread or signal handler."""
        self._stop_requested = True
        wakeups = self.wakeups
        if wakeups is not None:
            wakeups.stopping = True
            if self.handoff is not None:
                self.handoff.parked = None
            if not wakeups.loop.is_closed():
                wakeups.call_soon(wakeups.event.set)

    def wake(self) -> None:
        """Make the fetch loop look for work now (what a NOTIFY does). On the worker's loop."""
        if self.wakeups is not None:
            self.wakeups.wake()

    def run_sync(self, *, install_signal_handlers: bool = True) -> int:
        """Run until stopped; return the exit code (0 after a graceful stop, :data:`EXIT_STUCK`
        after a stuck sync handler).

        With ``install_signal_handlers``, the first SIGTERM or SIGINT stops gracefully and a second
        one exits the process at once with code 130 (leases then expire and are reaped).
        """
        return asyncio.run(self._main(install_signal_handlers))

    async def run(self) -> None:
        """Run in the current event loop until :meth:`stop` is called."""
        await self._main(False)

    @quieted
    async def _main(self, signals: bool) -> int:
        loop = asyncio.get_running_loop()
        wakeups = self.wakeups = Wakeups(loop)
        wakeups.stopping = self._stop_requested
        handlers = StopSignals(loop, stopping=lambda: self._stop_requested, stop=self._on_signal)
        if signals:
            handlers.install()
        if self.config.schedules and self.jobs.schedules:
            self.scheduler = Scheduler(self.jobs, self.connector)
        checks = StartChecks(
            jobs=self.jobs,
            queues=self.config.queues,
            scheduler=self.scheduler,
            sessions=self.sessions,
            monitor=self.monitor,
            build=lambda: self._build(wakeups),
        )
        try:
            # First: a metrics port that is taken stops the worker before it connects.
            self.monitor.open(wakeups, self.holdings)
            started = await Startup(self.connector, wakeups).run(checks.run, checks.undo)
        except BaseException:
            await checks.close()
            raise
        if not started:
            await checks.close()
            log.info("worker %s stopped before it started", self.name, extra={"event": "stopped"})
            return self._exit_code
        fetch = self._fetch
        assert self.lanes is not None
        try:
            await fetch.run(self._start_services)
            # First the listener: a claim its thread has in flight is delivered before the
            # shutdown gives back what was never started.
            await stop_thread(self.listener)
            await shutdown(
                self.lanes, self.holdings, self.config.shutdown_timeout, self._slots.busy_threads
            )
        except Exception:
            # Logged here, with its traceback: the CLI reports it in one line.
            log.exception("worker %s crashed", self.name, extra={"event": "crashed"})
            raise
        finally:
            for thread in (self.scheduler, self.listener, self.pruner, self.reaper, self.leases):
                await stop_thread(thread)
            if self.scheduler is not None:
                self.scheduler.engine.dispose()
            if self.sessions is not None:
                await self.sessions.close()
            await self.monitor.close(self.lanes.lanes[0].conn)
            await self.lanes.close()
            self._slots.close()
            self._steps.close()
            if signals:
                handlers.remove()
        said = " ".join(f"{key}={n}" for key, n in self.counts.items())
        log.info("worker %s stopped: %s", self.name, said, extra={"event": "stopped"})
        return self._exit_code

    def _build(self, wakeups: Wakeups) -> Parts:
        """The worker's parts on the event loop, wired to one another."""
        if self.jobs.hooks.reads_meta and not self._sql.meta:
            # Decided at start, from the hooks registered by then: only a worker with a
            # middleware that reads ctx.meta claims with the meta column (and pays for it).
            self._sql = WorkerSQL(self.jobs.schema, meta=True, timed=self._sql.timed)
            self.holdings.set_columns(meta=True, timed=self.holdings.timed)
        parts = build_parts(
            jobs=self.jobs,
            config=self.config,
            connector=self.connector,
            sql=self._sql,
            holdings=self.holdings,
            prefetch=self.prefetch,
            wakeups=wakeups,
            counts=self.counts,
            keyed=self._keyed,
            on_stuck=self._on_stuck,
            sessions=self.sessions,
            observer=self.monitor.observer,
        )
        self._steps, self.lanes, self._slots, self.handoff = (
            parts.steps,
            parts.lanes,
            parts.slots,
            parts.handoff,
        )
        self._fetch = parts.fetch
        return parts

    def _start_services(self) -> None:
        self._start_threads()
        self.monitor.start()
        schedules = len(self.jobs.schedules) if self.scheduler is not None else 0
        log_started(self.name, self.config, schedules)
        self.started.set()

    def _start_threads(self) -> None:
        assert self.wakeups is not None
        self.leases, self.reaper, self.pruner, self.listener = start_threads(
            connector=self.connector,
            sql=self._sql,
            config=self.config,
            channel=self.jobs.channel,
            holdings=self.holdings,
            wakeups=self.wakeups,
            handoff=self.handoff,
            heartbeats_paused=self._seams.heartbeats_paused,
            cancel_channel=self.jobs.cancel_channel,
            on_cancel=self._slots.cancel,
            schema=self.jobs.schema,
            monitor=self.monitor,
        )
        if self.scheduler is not None:
            self.scheduler.start()

    def _on_signal(self, sig: signal.Signals) -> None:
        """The first SIGTERM or SIGINT (a second one exits: :mod:`~sqla_jobs.worker.signals`)."""
        log.info(
            "%s: stopping (finishing %d running jobs, up to %gs)",
            sig.name,
            len(self.holdings.running),
            self.config.shutdown_timeout,
            extra={"event": "stopping"},
        )
        self.stop()

    def _on_stuck(self, job: ClaimedJob) -> None:
        # A hard time limit: stop claiming, and exit with EXIT_STUCK for a supervisor to restart.
        self._exit_code = EXIT_STUCK
        self.stop()
