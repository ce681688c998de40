"""Worker settings, and the refusal of settings that cannot work."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqla_jobs.db.connections import Connector
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.jobs import Jobs
from sqla_jobs.kinds import check_name
from sqla_jobs.retention import DEFAULT_RETENTION, Retention


@dataclass(frozen=True)
class WorkerConfig:
    """Validated worker settings (seconds as floats)."""

    queues: tuple[str, ...]
    concurrency: int = 4
    lease: float = 60.0
    heartbeat: float | None = None
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    listen: bool = True
    keep_history: bool = False
    reap_interval: float | None = None
    batch_size: int | None = None
    prefetch: int | None = None
    name: str | None = None
    prepared_statements: bool = True
    stuck_grace: float = 60.0
    #: None: no pruner thread.
    retention: Retention | None = DEFAULT_RETENTION
    prune_interval: float = 300.0
    #: Run the scheduler of the application's periodic schedules (if it declares any).
    schedules: bool = True
    #: Seconds a handler may hold its Session's transaction open before a warning.
    long_transaction: float = 60.0

    @property
    def heartbeat_seconds(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease / 3

    @property
    def reap_seconds(self) -> float:
        return self.reap_interval if self.reap_interval is not None else min(self.lease / 2, 30.0)


@dataclass(frozen=True)
class WorkerSeams:
    """What a test may put in place of a worker's real parts (``Worker(seams=...)``).

    ``connector`` builds the :class:`~sqla_jobs.db.connections.Connector` the worker opens every
    connection with (from conninfo, worker name, prepare threshold), to see or break them;
    while ``heartbeats_paused`` is set, no lease is renewed (a frozen process, without freezing
    one).
    """

    connector: Callable[[str, str, int | None], Connector] | None = None
    heartbeats_paused: threading.Event | None = None


def check_config(config: WorkerConfig, jobs: Jobs) -> None:
    """Refuse settings that cannot work, naming the setting and what to change."""
    if not config.queues:
        raise ConfigurationError("no queues to work: register kinds with handlers or pass queues")
    for q in config.queues:
        try:
            check_name("queue", q)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
    if config.concurrency < 1:
        raise ConfigurationError(f"concurrency must be >= 1, got {config.concurrency}")
    if config.lease <= 0 or config.poll_interval <= 0 or config.shutdown_timeout < 0:
        raise ConfigurationError("lease and poll_interval must be > 0, shutdown_timeout >= 0")
    if config.reap_interval is not None and config.reap_interval <= 0:
        raise ConfigurationError(f"reap_interval must be > 0, got {config.reap_interval}")
    if config.prune_interval <= 0:
        raise ConfigurationError(f"prune_interval must be > 0 seconds, got {config.prune_interval}")
    if not config.long_transaction > 0:
        raise ConfigurationError(
            f"long_transaction must be > 0 seconds, got {config.long_transaction}"
        )
    if config.stuck_grace <= 0:
        raise ConfigurationError(f"stuck_grace must be > 0 seconds, got {config.stuck_grace}")
    if config.heartbeat_seconds <= 0 or config.heartbeat_seconds > config.lease / 3:
        raise ConfigurationError(
            f"heartbeat ({config.heartbeat_seconds:g}s) must be > 0 and at most a third of the lease "
            f"({config.lease:g}s), so that two missed beats do not lose the lease"
        )
    if config.batch_size is not None and config.batch_size < 1:
        raise ConfigurationError(f"batch_size must be >= 1, got {config.batch_size}")
    if config.prefetch is not None and config.prefetch < 0:
        raise ConfigurationError(f"prefetch must be >= 0, got {config.prefetch}")
    for kind in jobs:
        timeout = kind.options.timeout
        if timeout is not None and kind.options.queue in config.queues and config.lease < timeout:
            raise ConfigurationError(
                f"lease ({config.lease:g}s) is shorter than the timeout of kind {kind.name!r} "
                f"({timeout:g}s): raise the lease (--lease) above the longest timeout"
            )
