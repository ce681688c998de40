"""Connection faults: ``pg_terminate_backend`` on each of a live worker's connections, at the moment
it is in use: the claim, a heartbeat, a completion, the LISTEN connection, and all of them at once.

To catch a statement in flight, a test-owned trigger makes that one kind of statement wait on an
advisory lock the test holds (the *gate*); the test terminates the waiting backend, then opens the
gate. A worker's backends are found by ``application_name`` (the worker names its connections
``sqla-jobs <role> host:pid:random``; its handlers' connections carry the fleet's PGAPPNAME) and
by the text of their statement.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import psycopg
import psycopg.sql
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_jobs.db.connections import reconnect_delay
from sqla_jobs.db.urls import libpq_conninfo
from tests.integration._workers import wait_until
from tests.reliability.chaos_app import (
    Fleet,
    Held,
    Work,
    WorkerProcess,
    jobs,
    open_gate,
    queue_length,
    reset_tables,
    runs_by_job,
    scalar,
)
from tests.reliability.conftest import Figures, injects, scaled

ROUNDS = scaled(3, 10)
OPTIONS = ("--concurrency", "4", "--lease", "2", "--heartbeat", "0.5", "--poll-interval", "1")
RECONNECT_EVENTS = ("conn_lost", "lease_conn_lost", "listener_lost")
#: The advisory lock (single-key) the gate trigger waits on.
GATE_KEY = 7_301_995

CLAIM_SQL = "WITH claimed AS%"
HEARTBEAT_SQL = "WITH mine AS MATERIALIZED%"
COMPLETE_SQL = "DELETE FROM sqla_jobs_job%"


class Gate:
    """A trigger that makes the worker statements it matches wait while the test holds the gate."""

    def __init__(self, url: str, event: str, when: str | None) -> None:
        self.conn = psycopg.connect(libpq_conninfo(url), autocommit=True)
        self.conn.execute(
            "CREATE OR REPLACE FUNCTION chaos_gate() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_advisory_xact_lock_shared({GATE_KEY}); "
            "IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END $$"
        )
        condition = f"WHEN ({when})" if when else ""
        self.conn.execute(
            f"CREATE TRIGGER chaos_gate BEFORE {event} ON sqla_jobs_job FOR EACH ROW "
            f"{condition} EXECUTE FUNCTION chaos_gate()"
        )

    def close(self) -> None:
        self.conn.execute("SELECT pg_advisory_unlock_all()")
        self.conn.execute("DROP TRIGGER IF EXISTS chaos_gate ON sqla_jobs_job")
        self.conn.execute("DROP FUNCTION IF EXISTS chaos_gate()")
        self.conn.close()

    def hold(self) -> None:
        self.conn.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))

    def open(self) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))

    def backends(self, worker: WorkerProcess, like: str, *, waiting: bool = False) -> list[int]:
        """The worker's backends whose current (or last) statement matches ``like``."""
        rows = self.conn.execute(
            f"SELECT pid FROM pg_stat_activity WHERE {worker.OWNS} AND query LIKE %s "
            "AND (NOT %s OR (state = 'active' AND wait_event_type = 'Lock'))",
            (*worker.owns_params(), like, waiting),
        ).fetchall()
        return [cast(int, r[0]) for r in rows]

    def waiting(self, worker: WorkerProcess, like: str) -> int:
        """Wait until a statement of ``worker`` matching ``like`` waits at the gate; its pid."""
        found: list[int] = []

        def blocked() -> bool:
            found[:] = self.backends(worker, like, waiting=True)
            return bool(found)

        wait_until(blocked, what=f"a statement like {like!r} waiting at the gate")
        return found[0]

    def terminate(self, pid: int) -> None:
        terminated = self.conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
        assert terminated == (True,)

    def terminate_waiting(self, worker: WorkerProcess, like: str) -> None:
        """Wait until a statement of ``worker`` matching ``like`` waits at the gate; kill it."""
        self.terminate(self.waiting(worker, like))


@contextmanager
def gated(url: str, event: str, when: str | None = None) -> Iterator[Gate]:
    gate = Gate(url, event, when)
    try:
        yield gate
    finally:
        gate.close()


@contextmanager
def one_worker(url: str, tmp_path: Path, *options: str) -> Iterator[tuple[Fleet, WorkerProcess]]:
    fleet = Fleet(url, tmp_path, options or OPTIONS)
    try:
        worker = fleet.spawn()
        fleet.wait_started(worker)
        yield fleet, worker
    finally:
        fleet.close()


def enqueue(engine: Engine, count: int, ms: int) -> list[int]:
    with Session(engine) as session:
        ids = jobs.enqueue_many(session, [Work(ms=ms) for _ in range(count)])
        session.commit()
    return ids


def queue_empty(engine: Engine) -> bool:
    return queue_length(engine) == 0


def reconnects(worker: WorkerProcess) -> int:
    return sum(worker.events(e) for e in RECONNECT_EVENTS)


def lease_ms(engine: Engine, aggregate: str) -> int:
    """The ``min`` or ``max`` lease expiry of the running jobs, in epoch milliseconds."""
    return scalar(
        engine,
        f"SELECT extract(epoch FROM {aggregate}(lease_expires_at)) * 1000 FROM sqla_jobs_job "
        "WHERE state = 'running'",
    )


def renewed_after(engine: Engine, mark: int) -> Callable[[], bool]:
    """A condition: every running job's lease now expires after ``mark`` (epoch ms)."""
    return lambda: lease_ms(engine, "min") > mark


def finish(fleet: Fleet, worker: WorkerProcess) -> None:
    """The worker survived every fault (same process) and still stops gracefully."""
    assert worker.proc.poll() is None, f"the worker died:\n{worker.log}"
    assert fleet.stop() == {worker.pid: 0}, worker.log


@injects("pg_terminate_backend on the worker's claim connection, mid-claim (rows locked)")
def test_a_claim_killed_mid_statement_loses_no_job_and_the_worker_reconnects(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Claim connection killed mid-claim: its rows go back to pending; each job runs once"""
    reset_tables(clean)
    ids: list[int] = []
    with (
        gated(migrated_url, "UPDATE", "OLD.state = 'pending' AND NEW.state = 'running'") as gate,
        # At DEBUG: a lane whose last claim began before the previous fault's outage and which
        # is killed before it worked again logs the fault as that outage's echo, at DEBUG (a
        # race on a loaded host). Every fault must still be logged, once or twice.
        one_worker(migrated_url, tmp_path, *OPTIONS, "--log-level", "debug") as (fleet, worker),
    ):
        for _ in range(ROUNDS):
            gate.hold()
            ids += enqueue(clean, 20, ms=5)
            gate.terminate_waiting(worker, CLAIM_SQL)
            gate.open()
            wait_until(lambda: queue_empty(clean), what="the round's jobs done")
        lines = reconnects(worker)
        finish(fleet, worker)
    runs = runs_by_job(clean)
    assert {i: runs[i] for i in ids if runs[i] != 1} == {}, "a job was lost or ran twice"
    assert ROUNDS <= lines <= 2 * ROUNDS, f"{lines} reconnect lines for {ROUNDS} faults"
    figures.record(faults=ROUNDS, jobs=len(ids), lost=0, duplicated=0, reconnect_log_lines=lines)


@injects("pg_terminate_backend on the lease connection while it renews leases (lease 2 s)")
def test_a_heartbeat_killed_mid_statement_is_retried_before_any_lease_expires(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Heartbeat connection killed mid-renewal: leases renewed on reconnect; nothing re-runs"""
    reset_tables(clean)
    # Running until the rounds are done, however long a loaded machine makes them: they need
    # heartbeats through every round (a fixed duration could end first).
    with Session(clean) as session:
        ids = jobs.enqueue_many(session, [Held(gate="rounds") for _ in range(4)])
        session.commit()
    running = "SELECT count(*) FROM sqla_jobs_job WHERE state = 'running'"
    with (
        gated(
            migrated_url,
            "UPDATE",
            "OLD.state = 'running' AND NEW.state = 'running' "
            "AND NEW.lease_expires_at > OLD.lease_expires_at",
        ) as gate,
        one_worker(migrated_url, tmp_path) as (fleet, worker),
    ):
        wait_until(lambda: scalar(clean, running) == 4, what="all four running")
        for _ in range(ROUNDS):
            assert scalar(clean, running) == 4, "a job finished before the faults were done"
            gate.hold()
            gate.terminate_waiting(worker, HEARTBEAT_SQL)
            gate.open()
            wait_until(
                renewed_after(clean, lease_ms(clean, "max")),
                what="every lease renewed after the fault",
            )
        open_gate(clean, "rounds")
        wait_until(lambda: queue_empty(clean), what="the long jobs done")
        lines = reconnects(worker)
        finish(fleet, worker)
    runs = runs_by_job(clean)
    assert {i: runs[i] for i in ids} == dict.fromkeys(ids, 1), "a lease was lost: a job re-ran"
    assert "event=reaped" not in worker.log
    assert ROUNDS <= lines <= 2 * ROUNDS, f"{lines} reconnect lines for {ROUNDS} faults"
    figures.record(faults=ROUNDS, jobs=len(ids), lost=0, duplicated=0, reconnect_log_lines=lines)


@injects("pg_terminate_backend on the worker's connection while it writes completions")
def test_a_completion_killed_mid_statement_is_rewritten_and_runs_nothing_twice(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Completion killed mid-write: rewritten after the reconnect; each job runs exactly once"""
    reset_tables(clean)
    ids: list[int] = []
    with (
        gated(migrated_url, "DELETE") as gate,
        one_worker(migrated_url, tmp_path) as (fleet, worker),
    ):
        for _ in range(ROUNDS):
            gate.hold()
            ids += enqueue(clean, 10, ms=5)
            gate.terminate_waiting(worker, COMPLETE_SQL)
            gate.open()
            wait_until(lambda: queue_empty(clean), what="the round's jobs done")
        lines = reconnects(worker)
        finish(fleet, worker)
    runs = runs_by_job(clean)
    assert {i: runs[i] for i in ids if runs[i] != 1} == {}, "a job was lost or ran twice"
    assert ROUNDS <= lines <= 2 * ROUNDS, f"{lines} reconnect lines for {ROUNDS} faults"
    figures.record(faults=ROUNDS, jobs=len(ids), lost=0, duplicated=0, reconnect_log_lines=lines)


def listener(conn: psycopg.Connection[tuple[object, ...]], worker: WorkerProcess) -> int:
    """Wait until the worker has exactly one LISTEN backend (named ``sqla-jobs listen ...``); its
    pid."""
    found: list[int] = []

    def one() -> bool:
        found[:] = [
            cast(int, r[0])
            for r in conn.execute(
                f"SELECT pid FROM pg_stat_activity WHERE {worker.OWNS} "
                "AND application_name LIKE 'sqla-jobs listen %%'",
                worker.owns_params(),
            )
        ]
        return len(found) == 1

    wait_until(one, what="one LISTEN connection")
    return found[0]


#: The LISTEN test's poll interval, and how soon its jobs must run: a deadline well under the poll
#: (only a NOTIFY or the reconnect's wakeup explains a pickup that soon), for a loaded machine.
QUIET_POLL = 60
NOTIFY_WITHIN = 20.0


@injects(f"pg_terminate_backend on the LISTEN connection (poll interval {QUIET_POLL} s)")
def test_a_killed_listen_connection_comes_back_and_notify_wakes_the_worker_again(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """LISTEN connection killed: it reconnects, and NOTIFY again wakes the worker without waiting
    for the poll"""
    reset_tables(clean)
    ids: list[int] = []
    latencies: list[float] = []
    options = (
        *("--concurrency", "4", "--lease", "2", "--heartbeat", "0.5"),
        *("--poll-interval", str(QUIET_POLL)),
    )
    admin = psycopg.connect(libpq_conninfo(migrated_url), autocommit=True)
    try:
        with one_worker(migrated_url, tmp_path, *options) as (fleet, worker):
            for n in range(1, ROUNDS + 1):
                ids += enqueue(clean, 20, ms=20)  # in flight while the listener dies
                old_pid = listener(admin, worker)
                admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
                wait_until(
                    worker.logged("listener_back", n),
                    what="the LISTEN connection re-established",
                )
                assert listener(admin, worker) != old_pid
                # Well inside the poll: the jobs in flight finish without waiting for it.
                wait_until(
                    lambda: queue_empty(clean),
                    timeout=NOTIFY_WITHIN,
                    what="the jobs in flight done",
                )
                started = time.monotonic()
                ids += enqueue(clean, 1, ms=0)
                wait_until(lambda: queue_empty(clean), timeout=NOTIFY_WITHIN, what="NOTIFY pickup")
                latencies.append(time.monotonic() - started)
            lines = reconnects(worker)
            finish(fleet, worker)
    finally:
        admin.close()
    runs = runs_by_job(clean)
    assert {i: runs[i] for i in ids if runs[i] != 1} == {}, "a job was lost or ran twice"
    assert ROUNDS <= lines <= 2 * ROUNDS, f"{lines} reconnect lines for {ROUNDS} faults"
    figures.record(
        faults=ROUNDS,
        jobs=len(ids),
        lost=0,
        duplicated=0,
        reconnect_log_lines=lines,
        notify_pickup_after_reconnect_s=round(max(latencies), 3),
    )


STORM_S = scaled(4, 15)


@injects(
    f"every backend of 2 worker processes terminated at random 50-400 ms intervals for {STORM_S} s"
)
def test_a_storm_of_terminated_connections_loses_no_job_and_reruns_each_at_most_once(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """All worker connections killed over and over: no job lost, each job at most one extra run"""
    reset_tables(clean)
    rng = random.Random(7)
    ids = enqueue(clean, scaled(400, 1500), ms=10)
    fleet = Fleet(migrated_url, tmp_path, OPTIONS)
    admin = psycopg.connect(libpq_conninfo(migrated_url), autocommit=True)
    storms = killed = 0
    try:
        workers = [fleet.spawn() for _ in range(2)]
        for w in workers:
            fleet.wait_started(w)
        end = time.monotonic() + STORM_S
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.05, 0.4))  # the fault's schedule, not a wait for an effect
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE (application_name LIKE 'chaos-w%%' OR application_name LIKE 'sqla-jobs %%')"
                " AND datname = current_database()"
            ).fetchone()
            killed += cast(int, row[0]) if row else 0
            storms += 1
        wait_until(lambda: queue_empty(clean), timeout=120, what="every job done after the storm")
        lines = [reconnects(w) for w in workers]
        assert fleet.alive() == workers, "a worker died:\n" + fleet.logs()
        codes = fleet.stop()
    finally:
        admin.close()
        fleet.close()
    assert set(codes.values()) == {0}, codes
    runs = runs_by_job(clean)
    lost = [i for i in ids if runs[i] == 0]
    reran = {i: n for i, n in runs.items() if n > 1}
    assert lost == []
    assert all(n == 2 for n in reran.values()), f"a job ran three times or more: {reran}"
    # Each storm can cost a worker one reconnect per connection (claims, leases, LISTEN), each
    # retried a few times with backoff: a busy loop would be orders of magnitude above this.
    assert max(lines) <= 6 * storms, f"reconnect lines {lines} for {storms} storms"
    figures.record(
        storms=storms,
        backends_killed=killed,
        jobs=len(ids),
        lost=0,
        duplicated=len(reran),
        reconnect_log_lines=max(lines),
    )


def test_the_listen_reconnect_backoff_starts_over_after_a_healthy_connection(
    clean: Engine, migrated_url: str, tmp_path: Path
) -> None:
    admin = psycopg.connect(libpq_conninfo(migrated_url), autocommit=True)
    try:
        with one_worker(migrated_url, tmp_path) as (fleet, worker):
            for n in range(1, 6):
                pid = listener(admin, worker)
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                wait_until(
                    worker.logged("listener_back", n),
                    what="the LISTEN connection re-established",
                )
                # Connected and listening again (a healthy connection) before the next loss.
                assert listener(admin, worker) != pid
            delays = [
                float(d)
                for d in re.findall(
                    r"event=listener_lost .*?reconnecting in ([0-9.]+)s", worker.log
                )
            ]
            finish(fleet, worker)
    finally:
        admin.close()
    # Each loss starts an outage of its own (the connection was healthy since the last one ended),
    # whose line says the delay: the first step's every time (0.1 s with jitter down to half),
    # never a doubled one (0.2 s and up).
    assert len(delays) == 5, worker.log
    first = reconnect_delay(1, first=0.05)
    assert all(first / 2 <= d <= first for d in delays), (
        f"reconnect delays grew across healthy periods: {delays}"
    )


def test_a_finished_job_keeps_its_lease_while_its_completion_waits_for_a_connection(
    clean: Engine, migrated_url: str, server_url: str, tmp_path: Path
) -> None:
    reset_tables(clean)
    outside = psycopg.connect(libpq_conninfo(server_url), autocommit=True)
    database = psycopg.sql.Identifier(clean.url.database or "")
    allow = psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}")
    try:
        with (
            gated(migrated_url, "DELETE") as gate,
            one_worker(migrated_url, tmp_path) as (fleet, worker),
        ):
            gate.hold()
            [job_id] = enqueue(clean, 1, ms=0)
            blocked = gate.waiting(worker, COMPLETE_SQL)
            # The worker's open connections (leases, LISTEN, the handler's) stay up; its claim
            # connection is killed mid-completion and cannot come back for now.
            outside.execute(allow.format(database, psycopg.sql.SQL("false")))
            gate.terminate(blocked)
            gate.open()
            lease_at_fault = gate.conn.execute(
                "SELECT lease_expires_at FROM sqla_jobs_job WHERE id = %s", (job_id,)
            ).fetchone()
            assert lease_at_fault is not None
            state: list[tuple[object, ...]] = []

            def reaped_or_renewed_twice() -> bool:
                row = gate.conn.execute(
                    "SELECT crashes > 0, lease_expires_at > %s + interval '4 seconds' "
                    "FROM sqla_jobs_job WHERE id = %s",
                    (lease_at_fault[0], job_id),
                ).fetchone()
                state[:] = [row] if row else []
                return row is not None and (bool(row[0]) or bool(row[1]))

            wait_until(reaped_or_renewed_twice, what="the lease reaped or renewed")
            outside.execute(allow.format(database, psycopg.sql.SQL("true")))
            wait_until(lambda: queue_empty(clean), what="the job completed")
            finish(fleet, worker)
    finally:
        outside.execute(allow.format(database, psycopg.sql.SQL("true")))
        outside.close()
    assert state, "the job vanished before the check"
    assert not state[0][0], "the finished job's lease expired and it was reaped"
    assert runs_by_job(clean)[job_id] == 1, "the job ran twice although its worker never died"
