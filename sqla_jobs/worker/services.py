"""The worker's threads: heartbeats, the reaper, the pruner and the listener, each on its own
connection.

They reach the event loop only through :class:`~sqla_jobs.worker.wakeups.Wakeups` (the listener through
the hand-off, the heartbeat thread to report lost leases), never through another part's state.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from sqla_jobs.db.connections import Conn, Connector
from sqla_jobs.observe.sampler import Sampler
from sqla_jobs.periodic.scheduler import Scheduler
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.config import WorkerConfig
from sqla_jobs.worker.handoff import Handoff
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.leases import LeaseKeeper
from sqla_jobs.worker.listener import Listener
from sqla_jobs.worker.pruner import Pruner
from sqla_jobs.worker.reaper import Reaper, reap_grace
from sqla_jobs.worker.wakeups import Wakeups


class Beats(Protocol):
    """What the worker's threads tell the rest of it (:class:`~sqla_jobs.worker.monitor.Monitor`)."""

    def alive(self, conn: Conn) -> object:
        """At each lease heartbeat, on the heartbeat thread's connection."""

    def beat(self, conn: Conn) -> object:
        """At each reap, on the reaper's connection."""

    def on_reaped(self, kind: str, queue: str) -> None:
        """A job of ``kind`` in ``queue`` was reaped (its worker crashed)."""


def start_threads(
    *,
    connector: Connector,
    sql: WorkerSQL,
    config: WorkerConfig,
    channel: str,
    holdings: Holdings,
    wakeups: Wakeups,
    handoff: Handoff | None,
    heartbeats_paused: threading.Event | None,
    cancel_channel: str,
    on_cancel: Callable[[list[int]], None],
    schema: str | None = None,
    monitor: Beats | None = None,
) -> tuple[LeaseKeeper, Reaper, Pruner | None, Listener | None]:
    """Start the heartbeat and reaper threads, the pruner unless the configuration keeps every
    finished job (``retention`` None or all forever), and the listener unless ``handoff`` is None
    (poll-only mode). ``on_cancel`` runs on the event loop with the ids of running jobs an
    operator cancelled, heard on ``cancel_channel`` or from a heartbeat. The heartbeat thread
    calls ``monitor.alive`` (the registry row) at each beat; the reaper calls ``monitor.beat``
    (the registry's pruning, the throughput counts) at each step and tells ``monitor.on_reaped``
    of each job it reaps."""

    def cancel_from_thread(ids: list[int]) -> None:
        wakeups.call_soon(on_cancel, ids)

    leases = LeaseKeeper(
        connector=connector,
        sql=sql,
        lease=timedelta(seconds=config.lease),
        heartbeat=config.heartbeat_seconds,
        snapshot=holdings.snapshot,
        on_lost=lambda held: wakeups.call_soon(holdings.lost, held),
        on_cancel=cancel_from_thread,
        paused=heartbeats_paused,
        alive=None if monitor is None else monitor.alive,
    )
    leases.start()
    reaper = Reaper(
        connector=connector,
        sql=sql,
        interval=config.reap_seconds,
        channel=channel,
        beat=None if monitor is None else monitor.beat,
        on_reaped=None if monitor is None else monitor.on_reaped,
        grace=reap_grace(config.lease, config.heartbeat_seconds),
    )
    reaper.start()
    pruner = None
    if config.retention is not None and config.retention.prunes:
        pruner = Pruner(
            connector=connector,
            schema=schema,
            retention=config.retention,
            interval=config.prune_interval,
        )
        pruner.start()
    listener = None
    if handoff is not None:
        listener = Listener(
            connector,
            channel,
            config.queues,
            handoff.on_notify,
            cancel_channel=cancel_channel,
            on_cancel=cancel_from_thread,
            on_due=wakeups.start_by_from_thread,
        )
        listener.start()
    return leases, reaper, pruner, listener


async def stop_thread(
    thread: LeaseKeeper | Reaper | Pruner | Listener | Scheduler | Sampler | None,
) -> None:
    """Ask ``thread`` to stop and wait for it (at most 10 s), off the event loop."""
    if thread is not None and thread.is_alive():
        thread.stop()
        await asyncio.to_thread(thread.join, 10)
