"""The application the reliability scenarios' worker processes run, and the fleet that runs them.

Workers are real processes: ``python -m sqla_jobs.cli worker tests.reliability.chaos_app:jobs``.
Every handler records each run it makes in ``chaos_effects`` (job id, attempt, crashes, pid), in its
own transaction committed before the handler returns, so a test sees from outside which runs
happened even when the process dies right after. A job with two rows there ran twice.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import libpq_conninfo

REPO = Path(__file__).resolve().parents[2]
TARGET = "tests.reliability.chaos_app:jobs"

jobs = Jobs()

TABLES_DDL = (
    # One row per run: a run is a claim (attempt) in one process, so a write retried after a
    # lost reply cannot count one run twice.
    "CREATE TABLE IF NOT EXISTS chaos_effects ("
    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL,"
    " attempt int NOT NULL, crashes int NOT NULL, pid int NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (job_id, attempt, pid))",
    "CREATE TABLE IF NOT EXISTS chaos_orders ("
    " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chaos_violations ("
    " job_id bigint NOT NULL, order_id bigint NOT NULL, pid int NOT NULL, UNIQUE (job_id, pid))",
    # Gates a test opens to let its held jobs finish (a row per open gate).
    "CREATE TABLE IF NOT EXISTS chaos_gates (gate text PRIMARY KEY)",
)
#: How long a held job waits for its gate at most: a test that died never leaves a worker waiting.
HOLD_CAP_S = 600.0


class Work(BaseModel):
    """Work for ``ms`` milliseconds, then record the run."""

    ms: int = 0


class Held(BaseModel):
    """Run until the test opens ``gate`` (:func:`open_gate`), then record the run."""

    gate: str


class Poison(BaseModel):
    """Record the run, then end the worker process at once, every time (a native crash)."""


class Fulfil(BaseModel):
    """Record the run, and a violation if order ``order_id`` (written in the transaction that
    enqueued this job) is not visible: the job would then have run before that commit."""

    order_id: int


_local = threading.local()


def _connection() -> psycopg.Connection[tuple[object, ...]]:
    conn: psycopg.Connection[tuple[object, ...]] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conninfo = libpq_conninfo(os.environ["DATABASE_URL"])
        conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=5)
        _local.conn = conn
    return conn


def _write(sql: str, params: tuple[object, ...]) -> None:
    """Run one idempotent autocommit statement on this handler thread's connection.

    A connection found broken (its backend was terminated while it sat idle in this thread, say)
    is replaced and the statement tried once more, as a pool with a health check would do; if
    that fails too, the error fails the job, which is retried.
    """
    for attempt in (1, 2):
        conn = _connection()
        try:
            conn.execute(sql, params)
            return
        except psycopg.OperationalError:
            conn.close()
            _local.conn = None
            if attempt == 2:
                raise


def record_run(ctx: JobContext) -> None:
    _write(
        "INSERT INTO chaos_effects (job_id, attempt, crashes, pid) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (ctx.job_id, ctx.attempt, ctx.crashes, os.getpid()),
    )


@jobs.kind("chaos_work", Work)
def work(args: Work, ctx: JobContext) -> None:
    time.sleep(args.ms / 1000)  # the work itself
    record_run(ctx)


def wait_for_gate(gate: str) -> None:
    """Return once the test has opened ``gate`` (or after ``HOLD_CAP_S``). A job that must still
    be running when the test looks waits on this event, not for a duration that a loaded
    machine can outlast."""
    deadline = time.monotonic() + HOLD_CAP_S
    while time.monotonic() < deadline:
        if _connection().execute("SELECT 1 FROM chaos_gates WHERE gate = %s", (gate,)).fetchone():
            return
        time.sleep(0.05)


@jobs.kind("chaos_held", Held)
def held(args: Held, ctx: JobContext) -> None:
    wait_for_gate(args.gate)
    record_run(ctx)


@jobs.kind("chaos_poison", Poison)
def poison(args: Poison, ctx: JobContext) -> None:
    record_run(ctx)
    os._exit(1)


@jobs.kind("chaos_fulfil", Fulfil)
def fulfil(args: Fulfil, ctx: JobContext) -> None:
    conn = _connection()
    seen = conn.execute("SELECT 1 FROM chaos_orders WHERE id = %s", (args.order_id,)).fetchone()
    if seen is None:
        _write(
            "INSERT INTO chaos_violations (job_id, order_id, pid) VALUES (%s, %s, %s) "
            "ON CONFLICT DO NOTHING",
            (ctx.job_id, args.order_id, os.getpid()),
        )
    record_run(ctx)


# -- the test side -------------------------------------------------------------------------------


def reset_tables(engine: Engine) -> None:
    """Create the scenario tables if needed and empty them and the queue tables."""
    with engine.begin() as conn:
        for ddl in TABLES_DDL:
            conn.execute(text(ddl))
        conn.execute(
            text(
                "TRUNCATE chaos_effects, chaos_orders, chaos_violations, chaos_gates, "
                "sqla_jobs_job, sqla_jobs_history"
            )
        )


def open_gate(engine: Engine, gate: str) -> None:
    """Let every job held on ``gate`` finish."""
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO chaos_gates VALUES (:g) ON CONFLICT DO NOTHING"), {"g": gate}
        )


def runs_by_job(engine: Engine) -> Counter[int]:
    """How many recorded runs each job made."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id, count(*) FROM chaos_effects GROUP BY job_id"))
        return Counter({int(job_id): int(n) for job_id, n in rows})


def scalar(engine: Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        value = conn.execute(text(sql), params).scalar()
    return int(value or 0)


def queue_length(engine: Engine) -> int:
    """Rows in the queue table: jobs not completed yet (pending, running or dead)."""
    return scalar(engine, "SELECT count(*) FROM sqla_jobs_job")


@contextlib.contextmanager
def queues_held(engine: Engine, held_jobs: Jobs) -> Iterator[None]:
    """Every queue that has jobs paused until the block ends: a fleet whose workers start one
    after another (seconds each on a loaded machine) then starts its run together, instead of
    its first worker draining the queue alone before a kill could find the others busy."""
    with Session(engine) as session, session.begin():
        names = list(session.execute(text("SELECT DISTINCT queue FROM sqla_jobs_job")).scalars())
        for name in names:
            held_jobs.pause_queue(session, name)
    try:
        yield
    finally:
        with Session(engine) as session, session.begin():
            for name in names:
                held_jobs.resume_queue(session, name)


def cli_env(database_url: str) -> dict[str, str]:
    """Our environment without SQLA_JOBS_* settings that would change a worker, plus the URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLA_JOBS_")}
    env["DATABASE_URL"] = database_url
    return env


@dataclass
class WorkerProcess:
    """One ``sqla-jobs worker`` process and the file its logfmt lines go to."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    #: The ``application_name`` of every connection the process opens (libpq's PGAPPNAME), so a
    #: test can find its backends in ``pg_stat_activity``.
    app_name: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    #: SQL condition on ``pg_stat_activity`` matching this process's backends, with its
    #: parameters: the worker names its own connections ``sqla-jobs <role> host:pid:random``; the
    #: handlers' connections carry ``app_name``.
    OWNS = "(application_name = %s OR application_name LIKE %s)"

    def owns_params(self) -> tuple[str, str]:
        return (self.app_name, f"sqla-jobs % %:{self.pid}:%")

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, event: str) -> int:
        """How many ``event=<event>`` lines this worker logged."""
        return self.log.count(f"event={event} ")

    def logged(self, event: str, times: int) -> Callable[[], bool]:
        """A condition: this worker logged ``event`` exactly ``times`` times."""
        return lambda: self.events(event) == times

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:
    # In the child, before exec: prctl(PR_SET_PDEATHSIG, SIGKILL).
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


@dataclass
class Fleet:
    """Worker processes on one database; :meth:`close` kills whatever is still running."""

    database_url: str
    log_dir: Path
    options: tuple[str, ...]
    workers: list[WorkerProcess] = field(default_factory=list)
    #: The ``MODULE:ATTR`` the workers run (another scenario app, e.g. ``fault_app``).
    target: str = TARGET
    #: SIGKILL the workers when the spawning thread dies (Linux): a test process killed outright
    #: then leaves no worker retrying against servers its guardian already removed.
    die_with_parent: bool = False

    def spawn(self) -> WorkerProcess:
        app_name = f"chaos-w{len(self.workers)}"
        log_path = self.log_dir / f"{app_name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sqla_jobs.cli", "worker", self.target, *self.options],
                cwd=REPO,
                env={**cli_env(self.database_url), "PGAPPNAME": app_name},
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        worker = WorkerProcess(proc, log_path, app_name)
        self.workers.append(worker)
        return worker

    def start_together(self, count: int, engine: Engine, held_jobs: Jobs) -> list[WorkerProcess]:
        """Spawn ``count`` workers with every queue held (:func:`queues_held`) until all of them
        have started: the run begins with the whole fleet up."""
        with queues_held(engine, held_jobs):
            started = [self.spawn() for _ in range(count)]
            for worker in started:
                self.wait_started(worker)
        return started

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.proc.poll() is None]

    def wait_started(self, worker: WorkerProcess, timeout: float = 30.0) -> None:
        """Wait until ``worker`` logs that it started (or fail, showing its log)."""
        deadline = time.monotonic() + timeout
        while "event=started " not in worker.log:
            if worker.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"worker {worker.pid} did not start (exit {worker.proc.poll()}):\n{worker.log}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> dict[int, int | None]:
        """SIGTERM every live worker; return their exit codes by pid (None: still running)."""
        live = self.alive()
        for w in live:
            # One spawned a moment ago may still be importing (slow on a loaded machine): a SIGTERM
            # before it installed its handlers kills it outright (-15), which is not the graceful
            # stop under test. It logs "started" once they are in place.
            with contextlib.suppress(AssertionError):
                self.wait_started(w, timeout)
            w.proc.send_signal(signal.SIGTERM)
        codes: dict[int, int | None] = {}
        for w in live:
            try:
                codes[w.pid] = w.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                codes[w.pid] = None
        return codes

    def close(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
        for w in self.workers:
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def logs(self) -> str:
        return "\n".join(
            f"--- worker {w.pid} (exit {w.proc.poll()})\n{w.log}" for w in self.workers
        )
