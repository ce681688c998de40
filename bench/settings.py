"""Sizes of the full run and of ``--quick``, and the context every measurement receives."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does."""

    enqueue_single: int = 10_000
    enqueue_bulk: int = 100_000
    drain_jobs: int = 20_000
    drain_concurrency: tuple[int, ...] = (4, 16)
    session_jobs: int = 10_000
    latency_jobs: int = 200
    latency_gap: float = 0.020
    mvcc_jobs: int = 10_000
    sustained_rate: float = 300.0
    sustained_seconds: float = 180.0
    sustained_sample_every: float = 5.0
    sustained_concurrency: int = 16
    contention_seconds: float = 5.0
    contention_workers: tuple[int, ...] = (4, 8)
    contention_jobs: int = 60_000
    memory_jobs: int = 100_000
    memory_concurrency: int = 16
    prune_history: int = 1_000_000
    commit_path_seconds: float = 12.0
    commit_path_clients: tuple[int, ...] = (1, 8, 32, 64)
    #: Writer threads of the library's own commit-path run (bench.commit_path_lib).
    commit_path_library_writers: tuple[int, ...] = (32, 64)
    growth_drain: int = 20_000
    growth_big: int = 2_000_000
    growth_dead: int = 500_000
    growth_keys: int = 1_000
    growth_pickup_jobs: int = 100
    growth_cpu_seconds: float = 10.0
    growth_idle_queues: int = 50
    #: Which backlogs of bench.growth to load (None: all of them).
    growth_backlogs: tuple[str, ...] | None = None


FULL = Sizes()
QUICK = Sizes(
    enqueue_single=500,
    enqueue_bulk=10_000,
    drain_jobs=2_000,
    session_jobs=1_000,
    latency_jobs=40,
    mvcc_jobs=1_000,
    sustained_rate=100.0,
    sustained_seconds=15.0,
    sustained_sample_every=1.0,
    contention_seconds=1.5,
    contention_jobs=20_000,
    memory_jobs=10_000,
    prune_history=50_000,
    commit_path_seconds=2.0,
    growth_drain=2_000,
    growth_big=50_000,
    growth_dead=20_000,
    growth_keys=100,
    growth_pickup_jobs=10,
    growth_cpu_seconds=0.5,
    growth_backlogs=("due", "scheduled", "keyed"),
)


@dataclass
class Context:
    """What a measurement needs: the server, the sizes, the repeat count, somewhere to log."""

    server_url: str
    sizes: Sizes
    repeat: int
    quick: bool
    results_dir: Path
    stamp: str
    started: float = field(default_factory=time.monotonic)

    def log(self, message: str) -> None:
        """Progress on stderr, so a full run's log shows where it is."""
        elapsed = time.monotonic() - self.started
        load = os.getloadavg()[0]
        print(f"[{elapsed:7.1f}s load {load:4.1f}] {message}", file=sys.stderr, flush=True)
