"""What a worker shows of itself: its row in the registry of live workers (always), its
per-minute throughput (unless turned off), and with :class:`~sqla_jobs.metrics.Metrics` its
health, the queue sampler and the metrics server.

The worker calls :meth:`Monitor.open` first (a metrics port that cannot be bound stops it before
anything else starts), :meth:`Monitor.join` on its first claim connection, :meth:`Monitor.start`
once its threads run, and :meth:`Monitor.close` last, after its threads stopped (``/healthz`` says
``stopping`` until then). This module never imports prometheus_client: the metrics object is the
caller's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqla_jobs.db.connections import AsyncConn, Conn, Connector
from sqla_jobs.jobs import Jobs
from sqla_jobs.observe.registry import Registry
from sqla_jobs.observe.runs import Observer, Observers
from sqla_jobs.observe.sampler import Sampler
from sqla_jobs.observe.tally import Tally
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.health import Health
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.services import stop_thread
from sqla_jobs.worker.wakeups import Wakeups

if TYPE_CHECKING:
    from sqla_jobs.observe.metrics import Metrics


class Monitor:
    """The registry row of worker ``name`` and, with ``metrics``, everything metrics need."""

    def __init__(
        self,
        *,
        jobs: Jobs,
        config: WorkerConfig,
        name: str,
        connector: Connector,
        metrics: Metrics | None,
        throughput: bool = True,
    ) -> None:
        self._jobs = jobs
        self._config = config
        self._connector = connector
        self.metrics = metrics
        # The registry beats with the leases, on the heartbeat thread's connection: stale then
        # means the leases are no longer renewed. A stale row is kept a lease longer.
        self.registry = Registry(
            schema=jobs.schema,
            name=name,
            queues=config.queues,
            concurrency=config.concurrency,
            beat=config.heartbeat_seconds,
            grace=config.lease,
        )
        #: The per-minute counts this worker adds to ``sqla_jobs_throughput`` (None: off).
        self.tally = Tally(schema=jobs.schema, name=name) if throughput else None
        self.health: Health | None = None
        self.sampler: Sampler | None = None

    @property
    def observer(self) -> Observer | None:
        """What the slots tell of each run (None without metrics and tally: nothing is told)."""
        present = [o for o in (self.metrics, self.tally) if o is not None]
        if len(present) > 1:
            return Observers(*present)
        return present[0] if present else None

    @property
    def timed(self) -> bool:
        """Whether the claims must return when each job became due (its pickup delay)."""
        return self.metrics is not None or self.tally is not None

    def on_reaped(self, kind: str, queue: str) -> None:
        """The reaper found a crashed job (counted by the metrics and the tally). Reaper thread."""
        if self.metrics is not None:
            self.metrics.reaped(kind, queue)
        if self.tally is not None:
            self.tally.reaped(kind, queue)

    def alive(self, conn: Conn) -> None:
        """At each lease heartbeat, on the heartbeat thread's connection: beat the registry row."""
        self.registry.beat(conn)

    def beat(self, conn: Conn) -> None:
        """At each reap, on the reaper's connection: prune the stale registry rows, write the
        tally."""
        self.registry.prune(conn)
        if self.tally is not None:
            self.tally.flush(conn)

    def open(self, wakeups: Wakeups, holdings: Holdings) -> None:
        """Before the worker connects: wire the metrics and bind their port (raises
        :class:`~sqla_jobs.ConfigurationError` if it is taken)."""
        if self.metrics is None:
            return
        health = self.health = Health(wakeups, holdings)
        queues = self._config.queues
        self.metrics._attach(
            health=health.check,
            running=lambda: len(holdings.running),
            kinds=[
                (k.name, k.options.queue)
                for k in self._jobs
                if k.handler is not None and k.options.queue in queues
            ],
            queues=queues,
        )

    async def join(self, conn: AsyncConn) -> None:
        """Register the worker (on its first claim connection)."""
        await self.registry.join(conn)

    def start(self) -> None:
        """The worker runs: start the sampler and the health's clock. On the loop."""
        if self.metrics is None or self.health is None:
            return
        interval = self.metrics.sample_interval
        if interval is not None:
            self.sampler = Sampler(
                connector=self._connector,
                schema=self._jobs.schema,
                interval=interval,
                on_sample=self.metrics.queues.sampled,
            )
            self.sampler.start()
        self.health.start()

    async def close(self, conn: AsyncConn | None) -> None:
        """The worker has stopped: leave the registry (on ``conn``, its first claim connection,
        if still open), stop the sampler and the metrics server. Never raises for the registry."""
        await stop_thread(self.sampler)
        if self.tally is not None:
            await self.tally.close(conn)
        await self.registry.leave(conn)
        if self.health is not None:
            self.health.stop()
        if self.metrics is not None:
            self.metrics._detach()
