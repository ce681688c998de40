"""One failover scenario's run: two ``sqla-jobs worker`` processes and a steady enqueue on a pair's
multi-host URL, the fault put on the servers, then the tally read from the new primary.

What the library sets on the worker's connections, which decides when a thread notices a server
that hangs rather than fails (a frozen primary): TCP keepalives (idle 30 s, interval 10 s, 3
probes: about a minute; ``sqla_jobs.db.urls.KEEPALIVES``), ``connect_timeout`` 5-10 s, and on the
LISTEN connection a ``tcp_user_timeout`` of its check timeout. The scenarios measure the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.reliability._standby import Node, Pair
from tests.reliability.chaos_app import Fleet
from tests.reliability.failover_app import TARGET, Enqueuer

#: Short leases, so a run the failover cut off is rescued within seconds; history kept, so the
#: tally sees what each finished job was charged.
LEASE = 4.0
OPTIONS = (
    "--concurrency", "4", "--lease", str(LEASE), "--heartbeat", "1", "--poll-interval", "0.2",
    "--keep-history",
)  # fmt: skip


def wait_for(what: str, cond: Callable[[], bool], timeout: float, logs: Callable[[], str]) -> None:
    """Poll ``cond`` (database errors count as not yet) until it holds, or fail with the logs."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psycopg.Error):
            if cond():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{logs()}")
        time.sleep(0.05)


@dataclass
class FailoverRun:
    """Workers and an enqueuer on ``pair``; :meth:`close` stops them (also after a failure)."""

    pair: Pair
    log_dir: Path
    workers: int = 2
    rate: float = 50.0
    #: How long each job works inside its transaction.
    ms: int = 20
    options: tuple[str, ...] = OPTIONS
    fleet: Fleet = field(init=False)
    enqueuer: Enqueuer = field(init=False)
    #: Each worker's log size at :meth:`mark`, and the end of the counted window.
    _marks: list[int] = field(default_factory=list)
    _ends: list[int] | None = None

    def start(self) -> FailoverRun:
        self.fleet = Fleet(
            self.pair.url(), self.log_dir, self.options, target=TARGET, die_with_parent=True
        )
        for _ in range(self.workers):
            self.fleet.spawn()
        for w in self.fleet.workers:
            self.fleet.wait_started(w, timeout=60)
        self.enqueuer = Enqueuer(self.pair.url(), rate=self.rate, ms=self.ms)
        self.enqueuer.start()
        return self

    def close(self) -> None:
        with contextlib.suppress(AttributeError):
            self.enqueuer.stop()
        with contextlib.suppress(AttributeError):
            self.fleet.close()

    def logs(self) -> str:
        return self.fleet.logs()

    def effects(self, node: Node, since: float | None = None) -> int:
        """Effects on ``node`` (stamped after ``since``, epoch seconds, when given)."""
        return int(
            node.sql(
                "SELECT count(*) FROM fo_effects WHERE at > to_timestamp(%s)",
                (since if since is not None else 0,),
            )
        )

    def wait_effects(
        self, node: Node, n: int, since: float | None = None, timeout: float = 120
    ) -> None:
        wait_for(
            f"{n} effects on {node.name}",
            lambda: self.effects(node, since) >= n,
            timeout,
            self.logs,
        )

    def mark(self) -> None:
        """Start counting log lines here (the fault)."""
        self._marks = [len(w.log.splitlines()) for w in self.fleet.workers]

    def lines(self) -> list[list[str]]:
        """Each worker's log lines since :meth:`mark` (up to :meth:`finish`)."""
        out = []
        for i, w in enumerate(self.fleet.workers):
            lines = w.log.splitlines()
            end = self._ends[i] if self._ends is not None else len(lines)
            out.append(lines[self._marks[i] : end])
        return out

    def first_run_after(self, node: Node, promoted_at: float, timeout: float = 120) -> float:
        """Seconds from ``promoted_at`` to the first effect stamped by the new primary."""
        self.wait_effects(node, 1, since=promoted_at, timeout=timeout)
        first = node.sql(
            "SELECT extract(epoch FROM min(at)) FROM fo_effects WHERE at > to_timestamp(%s)",
            (promoted_at,),
        )
        return round(float(first) - promoted_at, 2)

    def finish(self, node: Node, drain_timeout: float = 120) -> dict[str, Any]:
        """Stop the enqueue, wait until ``node`` has no pending or running job, fix the log window,
        and tally the outcome of every enqueue from ``node``'s tables."""
        self.enqueuer.stop()
        wait_for(
            "the queue drained on the new primary",
            lambda: (
                node.sql("SELECT count(*) FROM sqla_jobs_job WHERE state IN ('pending', 'running')")
                == 0
            ),
            drain_timeout,
            self.logs,
        )
        self._ends = [len(w.log.splitlines()) for w in self.fleet.workers]
        return tally(node, self.enqueuer)


def tally(node: Node, enq: Enqueuer) -> dict[str, Any]:
    """What became of each enqueue, read from ``node`` (the primary at the end)."""
    runs = dict(node.rows("SELECT token, count(*) FROM fo_effects GROUP BY token"))
    dead = {
        int(t)
        for (t,) in node.rows(
            "SELECT (payload->>'token')::bigint FROM sqla_jobs_job WHERE state = 'dead' UNION ALL "
            "SELECT (payload->>'token')::bigint FROM sqla_jobs_history WHERE outcome = 'dead'"
        )
    }
    charged = [
        int(t)
        for (t,) in node.rows(
            "SELECT (payload->>'token')::bigint FROM sqla_jobs_history"
            " WHERE coalesce(jsonb_array_length(errors), 0) > 0 OR last_error IS NOT NULL"
        )
    ]
    crashed = node.sql("SELECT count(*) FROM sqla_jobs_history WHERE crashes > 0")
    unknown_took = [t for t in enq.unknown if runs.get(t, 0) >= 1]
    return {
        "acked": len(enq.acked),
        "lost": sorted(t for t in enq.acked if runs.get(t, 0) == 0 and t not in dead),
        "duplicated": sorted(t for t, n in runs.items() if n > 1),
        "dead": sorted(dead),
        "unknown": len(enq.unknown),
        "unknown_took_effect": len(unknown_took),
        "refused": len(enq.refused),
        "charged": len(charged),
        "charged_tokens": sorted(charged),
        "crashed": int(crashed),
        "errors": sorted(set(enq.errors)),
    }


def workers_alive(run: FailoverRun) -> bool:
    """Every worker process still runs: none exited, none needed a restart."""
    return all(w.proc.poll() is None for w in run.fleet.workers)


def beaten_after(node: Node, run: FailoverRun, promoted_at: float) -> set[int]:
    """The pids of the run's workers whose registry row ``node`` saw beat after ``promoted_at``."""
    rows = node.rows(
        "SELECT pid FROM sqla_jobs_worker WHERE heartbeat_at > to_timestamp(%s)", (promoted_at,)
    )
    return {int(p) for (p,) in rows} & {w.pid for w in run.fleet.workers}


def throughput_mark(node: Node) -> tuple[int, float]:
    """The runs the workers' throughput rows on ``node`` count, all minutes together, and the
    moment (epoch seconds, ``node``'s clock) of the snapshot they were read in: a run whose effect
    is stamped later commits later, so its worker adds it to the rows after this count."""
    row = node.rows(
        "SELECT coalesce(sum(runs), 0), extract(epoch FROM now()) FROM sqla_jobs_throughput"
    )[0]
    return int(row[0]), float(row[1])


def last_token(node: Node, upto: int) -> int:
    """The highest token up to ``upto`` whose job ``node`` has (0 if none): with one enqueuing
    thread, commits reach the WAL in token order, so a standby cut off from its primary has every
    committed token up to it and none after."""
    return int(
        node.sql(
            "SELECT coalesce(max(t), 0) FROM (SELECT (payload->>'token')::bigint FROM sqla_jobs_job"
            " UNION ALL SELECT (payload->>'token')::bigint FROM sqla_jobs_history) AS s (t)"
            " WHERE t <= %s",
            (upto,),
        )
    )


def throughput_runs(node: Node) -> int:
    """The runs the workers' throughput rows on ``node`` count, all minutes together."""
    return int(node.sql("SELECT coalesce(sum(runs), 0) FROM sqla_jobs_throughput"))
