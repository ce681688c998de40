"""A held-back xmin horizon: another session keeps a snapshot open while the queue runs at a
sustained rate.

Every job leaves dead row versions behind (its insert, its claim, its delete); vacuum can remove
them only once no open snapshot can still see them. A REPEATABLE READ transaction left open (a
report, a stuck migration, an idle-in-transaction connection) pins them all. This scenario runs the
same load twice, without and with such a snapshot held, and measures what it costs: claim latency
(commit to handler start) and the dead tuples that a VACUUM can or cannot remove. Those are
measurements, recorded as figures, not asserted; what is asserted is that the snapshot really
pins the dead tuples, that they go once it is released, and that ``sqla-jobs stats`` warns about the
transaction while it is held.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, Worker
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.observe import stats
from tests._waiting import wait_until
from tests.reliability import edge_app
from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.edge_app import wait_running

QUEUE = "xmin"
#: Enqueue every TICK seconds, as many jobs as the rate owes by then.
TICK = 0.02
VACUUM_TUPLES = re.compile(
    r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable"
)

jobs = Jobs()
started: dict[int, float] = {}
started_lock = threading.Lock()


class Tick(BaseModel):
    n: int


@jobs.kind("xmin_tick", Tick, queue=QUEUE)
def tick(args: Tick, ctx: JobContext) -> None:
    with started_lock:
        started[ctx.job_id] = time.monotonic()


@dataclass
class Vacuumed:
    removed: int | None
    not_removable: int | None
    n_dead_tup: int


@dataclass
class Phase:
    """One load run and what it left behind."""

    name: str
    committed: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    drain_s: float = 0.0
    n_dead_tup: int = 0
    vacuum: Vacuumed | None = None

    def latencies_ms(self) -> list[float]:
        return sorted((started[i] - t) * 1000 for i, t in self.committed.items())

    def figures(self) -> dict[str, Any]:
        lat = self.latencies_ms()
        assert self.vacuum is not None
        return {
            f"{self.name}_jobs": len(self.committed),
            f"{self.name}_rate_per_s": round(len(self.committed) / self.seconds, 1),
            f"{self.name}_latency_p50_ms": round(statistics.median(lat), 1),
            f"{self.name}_latency_p95_ms": round(lat[int(len(lat) * 0.95) - 1], 1),
            f"{self.name}_latency_max_ms": round(lat[-1], 1),
            f"{self.name}_n_dead_tup": self.n_dead_tup,
            f"{self.name}_vacuum_removed": self.vacuum.removed,
            f"{self.name}_vacuum_not_removable": self.vacuum.not_removable,
        }


def n_dead_tup(engine: Engine) -> int:
    with engine.connect() as conn:
        value = conn.execute(
            text(
                "SELECT n_dead_tup FROM pg_stat_user_tables "
                "WHERE relname = 'sqla_jobs_job' AND schemaname = current_schema()"
            )
        ).scalar_one()
        return int(value)


def vacuum(url: str, engine: Engine) -> Vacuumed:
    """VACUUM the queue table and read what it could and could not remove."""
    messages: list[str] = []
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
        conn.execute("VACUUM (VERBOSE) sqla_jobs_job")
    found = next((m for m in map(VACUUM_TUPLES.search, messages) if m), None)
    return Vacuumed(
        removed=int(found.group(1)) if found else None,
        not_removable=int(found.group(3)) if found else None,
        # Set by the VACUUM itself: the dead tuples it had to leave.
        n_dead_tup=n_dead_tup(engine),
    )


def run_load(
    engine: Engine, crashes: list[BaseException], phase: Phase, rate: int, seconds: float
) -> None:
    """Enqueue ``rate`` jobs per second for ``seconds``, then wait for the worker to drain them."""
    pace = threading.Event()
    owed = 0.0
    n = 0
    begin = time.monotonic()
    next_tick = begin
    while time.monotonic() - begin < seconds:
        owed += rate * TICK
        batch = int(owed)
        owed -= batch
        if batch:
            with Session(engine) as session:
                ids = jobs.enqueue_many(session, [Tick(n=n + i) for i in range(batch)])
                session.commit()
            now = time.monotonic()
            phase.committed.update(dict.fromkeys(ids, now))
            n += batch
        next_tick += TICK
        # Rate control for the load generator, not a wait for a condition.
        pace.wait(max(0.0, next_tick - time.monotonic()))
    phase.seconds = time.monotonic() - begin
    wait_running(
        crashes,
        lambda: all(i in started for i in phase.committed),
        f"the worker runs the {phase.name} load",
        timeout=60 + seconds,
    )
    phase.drain_s = time.monotonic() - begin - phase.seconds
    phase.n_dead_tup = n_dead_tup(engine)


@pytest.fixture
def fresh(clean: Engine) -> Iterator[Engine]:
    started.clear()
    yield clean
    started.clear()


@injects("a REPEATABLE READ snapshot held open by another session during sustained load")
def test_held_snapshot_pins_dead_tuples_and_stats_warns_about_it(
    fresh: Engine, migrated_url: str, monkeypatch: pytest.MonkeyPatch, figures: Figures
) -> None:
    """Under sustained load with a worker keeping up, a snapshot held open by another session
    leaves the queue's dead tuples unremovable by VACUUM until it is released, and
    ``sqla-jobs stats`` warns about that transaction while it is open. Claim latency and dead
    tuples with and without the snapshot are recorded."""
    rate, seconds = scaled(100, 300), scaled(5, 60)
    baseline, held = Phase("without_snapshot"), Phase("with_snapshot")
    worker = Worker(jobs, migrated_url, queues=[QUEUE], concurrency=8, poll_interval=1.0)
    with edge_app.running(worker) as crashes:
        run_load(fresh, crashes, baseline, rate, seconds)
        baseline.vacuum = vacuum(migrated_url, fresh)

        holder = psycopg.connect(libpq_conninfo(migrated_url))
        try:
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM sqla_jobs_job")
            holder_pid = holder.info.backend_pid
            run_load(fresh, crashes, held, rate, seconds)
            held.vacuum = vacuum(migrated_url, fresh)

            # stats.OLD_TRANSACTION is 5 minutes; the snapshot is a few seconds old.
            monkeypatch.setattr(stats, "OLD_TRANSACTION", timedelta(seconds=1))
            seen = stats.collect(migrated_url)
            with fresh.connect() as conn:
                holder_age = conn.execute(
                    text("SELECT now() - xact_start FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": holder_pid},
                ).scalar_one()
        finally:
            holder.close()
        released = vacuum(migrated_url, fresh)

    # The warning names the holder (or a transaction even older, of some other session).
    assert seen.oldest_transaction is not None
    assert seen.oldest_transaction["pid"] == holder_pid or (
        seen.oldest_transaction["age"] >= holder_age
    )
    pid = seen.oldest_transaction["pid"]
    assert any(w.startswith("transaction open for") and f"(pid {pid}," in w for w in seen.warnings)
    assert "WARNING: transaction open for" in stats.render(seen)

    # Every job leaves dead versions; with the snapshot held, VACUUM could remove none of the
    # held phase's, and once it is released it removes them.
    assert held.vacuum.n_dead_tup >= len(held.committed)
    assert baseline.vacuum.n_dead_tup < held.vacuum.n_dead_tup
    # Another session of the server (a neighbour's test, beside this one) may hold the horizon
    # a moment longer: VACUUM again until it has removed them, within the suite's deadline.
    if released.n_dead_tup >= held.vacuum.n_dead_tup:
        wait_until(
            lambda: vacuum(migrated_url, fresh).n_dead_tup < held.vacuum.n_dead_tup,
            "VACUUM removes the dead tuples once the snapshot is released",
        )
    figures.record(
        rate_per_s=rate,
        seconds_per_phase=seconds,
        **baseline.figures(),
        **held.figures(),
        after_release_vacuum_removed=released.removed,
        after_release_n_dead_tup=released.n_dead_tup,
        stats_warning=seen.warnings[0],
    )


# -- what stats looks at --------------------------------------------------------------------------


def churn_and_vacuum(url: str, engine: Engine, rows: int = 200) -> Vacuumed:
    """Write and delete ``rows`` queue rows directly, then VACUUM."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload) "
                "SELECT 'churn', 'churn', '{}' FROM generate_series(1, :n)"
            ),
            {"n": rows},
        )
        conn.execute(text("DELETE FROM sqla_jobs_job WHERE queue = 'churn'"))
    return vacuum(url, engine)


@pytest.fixture
def writer(migrated_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A session idle in a READ COMMITTED transaction that holds a transaction id but no
    snapshot: what an application that wrote a row and then hung leaves behind."""
    conn = psycopg.connect(libpq_conninfo(migrated_url))
    conn.execute("SELECT pg_current_xact_id()")
    yield conn
    conn.close()


@pytest.fixture
def elsewhere(server_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A REPEATABLE READ snapshot held open in another database of the same server."""
    conn = psycopg.connect(libpq_conninfo(server_url))
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT count(*) FROM pg_class")
    yield conn
    conn.close()


def activity(engine: Engine, pid: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT datname, backend_xid, backend_xmin FROM pg_stat_activity WHERE pid = :pid"
            ),
            {"pid": pid},
        ).first()


@injects("an idle transaction that holds a transaction id but no snapshot")
def test_idle_transaction_with_an_xid_and_no_snapshot_pins_dead_tuples(
    fresh: Engine, migrated_url: str, writer: psycopg.Connection[Any], figures: Figures
) -> None:
    """A READ COMMITTED transaction that was given a transaction id and went idle shows no
    backend_xmin in pg_stat_activity, yet VACUUM cannot remove what died after it began."""
    row = activity(fresh, writer.info.backend_pid)
    assert row.backend_xid is not None
    assert row.backend_xmin is None
    pinned = churn_and_vacuum(migrated_url, fresh)
    assert pinned.n_dead_tup >= 200
    figures.record(vacuum_not_removable=pinned.not_removable)


@injects("an idle transaction that holds a transaction id but no snapshot")
def test_stats_warns_about_an_idle_transaction_that_holds_an_xid(
    fresh: Engine,
    migrated_url: str,
    writer: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sqla-jobs stats`` warns about an idle transaction that holds back vacuum through its
    transaction id, not only through a snapshot."""
    monkeypatch.setattr(stats, "OLD_TRANSACTION", timedelta(0))
    seen = stats.collect(migrated_url)
    assert seen.oldest_transaction is not None
    assert seen.oldest_transaction["pid"] == writer.info.backend_pid
    assert seen.warnings


@injects("a snapshot held open in another database of the same server")
def test_snapshot_held_in_another_database_does_not_pin_this_databases_dead_tuples(
    fresh: Engine, migrated_url: str, elsewhere: psycopg.Connection[Any], figures: Figures
) -> None:
    """A snapshot held in another database does not stop VACUUM from removing the queue's dead
    tuples (PostgreSQL 14+ computes the horizon per database)."""
    assert activity(fresh, elsewhere.info.backend_pid).backend_xmin is not None
    cleaned = churn_and_vacuum(migrated_url, fresh)
    assert cleaned.not_removable == 0
    figures.record(vacuum_removed=cleaned.removed, vacuum_not_removable=cleaned.not_removable)


@injects("a snapshot held open in another database of the same server")
def test_stats_does_not_blame_a_transaction_in_another_database(
    fresh: Engine,
    migrated_url: str,
    elsewhere: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sqla-jobs stats`` reports only transactions that can hold back the queue table's vacuum:
    not one open in another database."""
    monkeypatch.setattr(stats, "OLD_TRANSACTION", timedelta(0))
    seen = stats.collect(migrated_url)
    this_database = fresh.url.database
    if seen.oldest_transaction is not None:
        assert activity(fresh, seen.oldest_transaction["pid"]).datname == this_database


@injects("a REPEATABLE READ snapshot held open by another session")
def test_sqla_jobs_stats_command_warns_about_a_transaction_older_than_its_threshold(
    fresh: Engine, migrated_url: str
) -> None:
    """``sqla-jobs stats --old-transaction 0.5``, run as a command, warns about a snapshot held
    open for longer than half a second."""
    with psycopg.connect(libpq_conninfo(migrated_url)) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM sqla_jobs_job")
        pid = holder.info.backend_pid

        def held_long_enough() -> bool:
            with fresh.connect() as conn:
                age = conn.execute(
                    text("SELECT now() - xact_start FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": pid},
                ).scalar_one()
            return bool(age > timedelta(seconds=0.6))

        edge_app.wait_for(held_long_enough, "the snapshot is older than the threshold")
        done = subprocess.run(
            [sys.executable, "-m", "sqla_jobs.cli", "stats", "--old-transaction", "0.5"],
            cwd=edge_app.REPO,
            env=edge_app.worker_env(migrated_url, None, None),
            capture_output=True,
            text=True,
            timeout=60,
        )
        holder.rollback()
    assert done.returncode == 0, done.stderr
    assert "WARNING: transaction open for" in done.stdout
