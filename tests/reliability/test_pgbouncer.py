"""PgBouncer in transaction pooling between sqla-jobs and PostgreSQL: a real ``pgbouncer`` process,
started by the tests on a free port in front of the session's database.

In transaction pooling a client connection gets a server connection for one transaction at a time,
so session state does not survive between transactions: no LISTEN (the worker polls, ``listen=False``)
and no server-side prepared statements unless PgBouncer is at least 1.21 and tracks them
(``max_prepared_statements``). psycopg prepares a statement after its fifth run, so the application's
engine needs ``connect_args={"prepare_threshold": None}`` and the worker needs a way to do the same.

The tests skip only when no ``pgbouncer`` binary is installed (``apt-get install pgbouncer``), and
the one that needs ``max_prepared_statements`` when PgBouncer is older than 1.21. The workers run
with ``prepared_statements=False`` (``--no-prepared-statements``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Backoff, JobContext, Jobs, Worker
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
from tests.reliability import edge_app
from tests.reliability._ports import free_port
from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.edge_app import EFFECTS_DDL, EFFECTS_TABLE, Hold, edge_workers, wait_for

PGBOUNCER_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")
ALIAS = "sqla_jobs_pgbouncer"
#: Server connections per pool: fewer than the clients, so their transactions share them.
POOL_SIZE = 3
#: Ports PgBouncer is started on before the test gives up (see start_pgbouncer).
PORT_ATTEMPTS = 5


# -- PgBouncer ------------------------------------------------------------------------------------


@dataclass
class Bouncer:
    """A running PgBouncer in transaction pooling, in front of one database."""

    url: str
    version: tuple[int, ...]
    proc: subprocess.Popen[bytes]
    workdir: Path
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def engine(self) -> Engine:
        """An application engine through PgBouncer: psycopg must not prepare statements."""
        return create_engine(
            sqlalchemy_url(self.url), pool_size=4, connect_args={"prepare_threshold": None}
        )


def pgbouncer_binary() -> str:
    """The pgbouncer executable; the tests are skipped only if none is installed."""
    for candidate in (shutil.which("pgbouncer"), *PGBOUNCER_PATHS):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")


def pgbouncer_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    assert found, f"cannot read the PgBouncer version from {out!r}"
    return tuple(int(g or 0) for g in found.groups())


def run_as_user(server_host: str) -> pwd.struct_passwd | None:
    """PgBouncer refuses to run as root: the user to switch to (``-u``), or None when not root.

    It must be able to reach the server: for a Unix socket, the owner of its directory (the embedded
    server's user); over TCP, ``postgres`` or ``nobody``.
    """
    if os.geteuid() != 0:
        return None
    if server_host.startswith("/"):
        return pwd.getpwuid(os.stat(server_host).st_uid)
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    pytest.fail("running as root, and there is no postgres or nobody user to run pgbouncer as")


@contextlib.contextmanager
def start_pgbouncer(
    target_url: str, *, max_prepared_statements: int | None = None
) -> Iterator[Bouncer]:
    """Start PgBouncer (transaction pooling, ``auth_type = any``) in front of ``target_url``'s
    database on a free port; stop it and remove its files on exit."""
    binary = pgbouncer_binary()
    version = pgbouncer_version(binary)
    with psycopg.connect(libpq_conninfo(target_url)) as conn:
        info = conn.info
        host, port, user, password, dbname = (
            info.host,
            info.port,
            info.user,
            info.password,
            info.dbname,
        )
    target = f"host={host} port={port} dbname={dbname} user={user}"
    if password:
        target += " password='" + password.replace("'", "''") + "'"
    settings = {
        "listen_addr": "127.0.0.1",
        "unix_socket_dir": "",
        # Clients are not authenticated; PgBouncer logs in to the server as the target's user.
        "auth_type": "any",
        "pool_mode": "transaction",
        "default_pool_size": str(POOL_SIZE),
        "max_client_conn": "200",
    }
    if version >= (1, 21):
        # Pin the prepared-statement behaviour: off unless the test asks for it.
        settings["max_prepared_statements"] = str(max_prepared_statements or 0)
    elif max_prepared_statements:
        pytest.skip(f"PgBouncer {'.'.join(map(str, version))} predates max_prepared_statements")
    workdir = Path(tempfile.mkdtemp(prefix="sqla-jobs-pgbouncer-"))
    settings["logfile"] = str(workdir / "pgbouncer.log")
    settings["pidfile"] = str(workdir / "pgbouncer.pid")
    bouncer: Bouncer | None = None
    try:
        # free_port() releases the port before PgBouncer binds it; a parallel test may take it in
        # between. PgBouncer then exits at once, and it is started again on another port.
        for _ in range(PORT_ATTEMPTS):
            settings["listen_port"] = str(free_port())
            bouncer = _launch(binary, version, workdir, target, host, user, settings)
            if _accepts(bouncer):
                break
            bouncer = None
        else:
            pytest.fail(f"pgbouncer found no free port in {PORT_ATTEMPTS} tries")
        yield bouncer
    finally:
        if bouncer is not None:
            _stop(bouncer.proc)
        shutil.rmtree(workdir, ignore_errors=True)


def _launch(
    binary: str,
    version: tuple[int, ...],
    workdir: Path,
    target: str,
    host: str,
    user: str,
    settings: dict[str, str],
) -> Bouncer:
    """Write the config and start PgBouncer on ``settings``' port (as another user when root)."""
    ini = workdir / "pgbouncer.ini"
    for stale in ("pgbouncer.log", "stderr.log", "pgbouncer.pid"):
        (workdir / stale).unlink(missing_ok=True)
    ini.write_text(
        f"[databases]\n{ALIAS} = {target}\n\n[pgbouncer]\n"
        + "".join(f"{k} = {v}\n" for k, v in settings.items())
    )
    ini.chmod(0o600)
    user_switch: list[str] = []
    account = run_as_user(host)
    if account is not None:
        for path in (workdir, ini):
            os.chown(path, account.pw_uid, account.pw_gid)
        user_switch = ["-u", account.pw_name]
    with (workdir / "stderr.log").open("wb") as stderr:
        proc = subprocess.Popen(
            [binary, *user_switch, str(ini)], stdout=subprocess.DEVNULL, stderr=stderr
        )
    return Bouncer(
        url=f"postgresql://{user}@127.0.0.1:{settings['listen_port']}/{ALIAS}",
        version=version,
        proc=proc,
        workdir=workdir,
        settings=dict(settings),
    )


def _accepts(bouncer: Bouncer) -> bool:
    """Wait until PgBouncer accepts connections (True), or exits because its port was taken
    (False); any other exit fails the test."""
    proc = bouncer.proc

    def up() -> str:
        if proc.poll() is not None:
            stderr_text = (bouncer.workdir / "stderr.log").read_text(errors="replace")
            if "in use" in stderr_text + bouncer.log:
                return "port taken"
            raise AssertionError(
                f"pgbouncer exited with {proc.returncode}:\n{stderr_text}\n{bouncer.log}"
            )
        try:
            with psycopg.connect(libpq_conninfo(bouncer.url), connect_timeout=2) as c:
                c.execute("SELECT 1")
            return "up"
        except psycopg.OperationalError:
            return ""

    return wait_for(up, "pgbouncer accepts connections or exits", timeout=60) == "up"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def bouncer(migrated_url: str, engine: Engine) -> Iterator[Bouncer]:
    """PgBouncer in transaction pooling in front of the session's database, for this module."""
    with engine.begin() as conn:
        conn.execute(text(EFFECTS_DDL))
    with start_pgbouncer(migrated_url) as running_bouncer:
        # Proof of transaction pooling: a server connection serves whichever client runs the next
        # transaction. b gets the one a released at its commit (in session pooling, a would hold it
        # until it disconnects, and b would get another).
        conninfo = libpq_conninfo(running_bouncer.url)
        with psycopg.connect(conninfo) as a, psycopg.connect(conninfo) as b:
            pid_a = a.execute("SELECT pg_backend_pid()").fetchone()
            a.commit()
            pid_b = b.execute("SELECT pg_backend_pid()").fetchone()
            b.commit()
        assert pid_a == pid_b, "PgBouncer is not pooling transactions"
        yield running_bouncer


# -- the application ------------------------------------------------------------------------------

jobs = Jobs()


class Ping(BaseModel):
    n: int


class Flaky(BaseModel):
    n: int


class Keyed(BaseModel):
    key: str
    n: int


@dataclass
class Seen:
    """What the handlers of this module did, for the current test."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    runs: Counter[int] = field(default_factory=Counter)
    step_calls: Counter[int] = field(default_factory=Counter)
    running: Counter[str] = field(default_factory=Counter)
    max_running: Counter[str] = field(default_factory=Counter)


seen = Seen()


@jobs.kind("pgb_ping", Ping, queue="pgb")
def ping(args: Ping, ctx: JobContext) -> None:
    with seen.lock:
        seen.runs[ctx.job_id] += 1

    def echo() -> int:
        with seen.lock:
            seen.step_calls[ctx.job_id] += 1
        return args.n

    assert ctx.step("echo", echo) == args.n


@jobs.kind("pgb_flaky", Flaky, queue="pgb", max_attempts=2, backoff=Backoff(base=2, jitter=0))
def flaky(args: Flaky, ctx: JobContext) -> None:
    raise RuntimeError(f"boom {args.n}")


@jobs.kind("pgb_keyed", Keyed, queue="pgb", concurrency_key=lambda p: p.key, concurrency_limit=1)
def keyed(args: Keyed, ctx: JobContext) -> None:
    with seen.lock:
        seen.running[args.key] += 1
        seen.max_running[args.key] = max(seen.max_running[args.key], seen.running[args.key])
    try:
        threading.Event().wait(0.01)  # stands in for work, so that jobs overlap
    finally:
        with seen.lock:
            seen.running[args.key] -= 1
            seen.runs[ctx.job_id] += 1


@pytest.fixture
def handlers() -> Seen:
    """The handlers' record, emptied."""
    global seen
    seen = Seen()
    return seen


def bounced_worker(bouncer: Bouncer, **options: Any) -> Worker:
    """A poll-only worker through PgBouncer, with server-side prepared statements off."""
    defaults: dict[str, Any] = {"poll_interval": 0.05, "lease": 10.0, "concurrency": 4}
    return Worker(
        jobs, bouncer.url, listen=False, prepared_statements=False, **{**defaults, **options}
    )


def count(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


# -- the scenarios --------------------------------------------------------------------------------


@injects("PgBouncer, transaction pooling, between the application and PostgreSQL")
def test_enqueue_through_transaction_pooling_keeps_exactly_the_committed_jobs(
    bouncer: Bouncer, clean: Engine, figures: Figures
) -> None:
    """Through PgBouncer in transaction pooling, concurrent sessions enqueue (one by one and in
    batches): every committed job exists once, and jobs of rolled-back transactions and savepoints
    do not."""
    app = bouncer.engine()
    transactions = scaled(200, 4000)
    committed: list[int] = []
    lock = threading.Lock()

    def produce(first: int) -> None:
        for i in range(first, transactions, 4):
            with Session(app) as session:
                if i % 2:
                    ids = jobs.enqueue_many(session, [Ping(n=i), Ping(n=i)])
                else:
                    ids = [jobs.enqueue(session, Ping(n=i)).id]
                savepoint = session.begin_nested()
                jobs.enqueue(session, Ping(n=-1))
                savepoint.rollback()
                if i % 10 == 0:
                    jobs.enqueue(session, Ping(n=-2))
                    session.rollback()
                    continue
                session.commit()
            with lock:
                committed.extend(ids)

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(produce, range(4)))
    finally:
        app.dispose()
    elapsed = time.monotonic() - started
    with clean.connect() as conn:
        stored = [r[0] for r in conn.execute(text("SELECT id FROM sqla_jobs_job ORDER BY id"))]
    assert sorted(committed) == stored
    assert count(clean, "SELECT count(*) FROM sqla_jobs_job WHERE (payload->>'n')::int < 0") == 0
    figures.record(
        pgbouncer=".".join(map(str, bouncer.version)),
        server_connections=POOL_SIZE,
        client_sessions=4,
        transactions=transactions,
        jobs=len(stored),
        seconds=round(elapsed, 2),
    )


@injects("PgBouncer, transaction pooling, between the workers and PostgreSQL")
def test_poll_only_workers_run_every_job_once_through_transaction_pooling(
    bouncer: Bouncer, clean: Engine, handlers: Seen, figures: Figures
) -> None:
    """Two poll-only workers through PgBouncer in transaction pooling run every job exactly once,
    recording a durable step each, and leave the queue empty."""
    n = scaled(300, 5000)
    with Session(clean) as session:
        ids = jobs.enqueue_many(session, [Ping(n=i) for i in range(n)])
        session.commit()
    started = time.monotonic()
    with edge_app.running(bounced_worker(bouncer), bounced_worker(bouncer)):
        wait_for(
            lambda: count(clean, "SELECT count(*) FROM sqla_jobs_job") == 0,
            "the workers drain the queue",
            timeout=60 + n / 20,
        )
    elapsed = time.monotonic() - started
    assert set(handlers.runs) == set(ids)
    duplicated = sum(1 for c in handlers.runs.values() if c > 1)
    assert duplicated == 0
    assert all(handlers.step_calls[i] == 1 for i in ids)
    figures.record(jobs=n, workers=2, seconds=round(elapsed, 2), duplicated=duplicated, lost=0)


@injects("PgBouncer, transaction pooling; a handler that always raises")
def test_failing_job_backs_off_then_goes_dead_through_transaction_pooling(
    bouncer: Bouncer, clean: Engine, handlers: Seen, figures: Figures
) -> None:
    """Through PgBouncer in transaction pooling, a failing job goes back to pending with the
    backoff computed by the database, and is dead once its attempts are spent."""
    with Session(clean) as session:
        job_id = jobs.enqueue(session, Flaky(n=1)).id
        session.commit()

    def job_row() -> Any:
        with clean.connect() as conn:
            return conn.execute(
                text(
                    "SELECT state, attempts, EXTRACT(EPOCH FROM run_at - now()) AS wait, "
                    "last_error FROM sqla_jobs_job WHERE id = :id AND lease_token IS NULL "
                    "AND attempts >= :attempts"
                ),
                {"id": job_id, "attempts": 1},
            ).first()

    with edge_app.running(bounced_worker(bouncer)):
        first = wait_for(job_row, "the first failure is recorded")
        assert first.state == "pending"
        assert first.attempts == 1
        # Backoff(base=2): 2 ** 1 seconds after the failure, by the database's clock.
        assert 0 < float(first.wait) <= 2.0
        assert "boom 1" in first.last_error
        with clean.begin() as conn:
            conn.execute(
                text("UPDATE sqla_jobs_job SET run_at = now() WHERE id = :id"), {"id": job_id}
            )

        def dead() -> Any:
            row = job_row()
            return row if row is not None and row.state == "dead" else None

        final = wait_for(dead, "the job is dead after its second failure")
    assert final.attempts == 2
    assert "boom 1" in final.last_error
    figures.record(first_backoff_s=round(float(first.wait), 3), attempts_to_dead=final.attempts)


@injects("PgBouncer, transaction pooling; concurrency-keyed jobs (advisory locks per transaction)")
def test_concurrency_keys_hold_their_limit_through_transaction_pooling(
    bouncer: Bouncer, clean: Engine, handlers: Seen, figures: Figures
) -> None:
    """Through PgBouncer in transaction pooling, the keyed claim (transaction-scoped advisory
    locks) still runs at most one job per key at a time, across two workers."""
    keys = [f"customer:{i}" for i in range(4)]
    n = scaled(80, 800)
    with Session(clean) as session:
        ids = jobs.enqueue_many(session, [Keyed(key=keys[i % len(keys)], n=i) for i in range(n)])
        session.commit()
    with edge_app.running(bounced_worker(bouncer), bounced_worker(bouncer)):
        wait_for(
            lambda: count(clean, "SELECT count(*) FROM sqla_jobs_job") == 0,
            "the workers drain the keyed jobs",
            timeout=60,
        )
    assert sorted(handlers.runs) == sorted(ids)
    assert set(handlers.runs.values()) == {1}
    assert max(handlers.max_running.values()) == 1
    figures.record(jobs=n, keys=len(keys), max_running_per_key=max(handlers.max_running.values()))


@injects("PgBouncer, transaction pooling; SIGKILL of the worker running the job")
def test_sigkilled_workers_job_is_rescued_by_another_worker_through_transaction_pooling(
    bouncer: Bouncer, clean: Engine, migrated_url: str, tmp_path: Path, figures: Figures
) -> None:
    """A worker process behind PgBouncer is SIGKILLed mid-job; once its lease expires another
    worker behind PgBouncer reaps the job and completes it, counted as a crash."""
    with clean.begin() as conn:
        conn.execute(text(f"TRUNCATE {EFFECTS_TABLE}"))
    options = (
        "--no-listen",
        "--no-prepared-statements",
        "--queues",
        "edge",
        "--lease",
        "2",
        "--heartbeat",
        "0.5",
        "--poll-interval",
        "0.1",
        "--keep-history",
    )
    with edge_workers(tmp_path) as spawn:
        victim = spawn(bouncer.url, *options, effects_url=migrated_url)
        victim.wait_logged("started")
        with Session(clean) as session:
            job_id = edge_app.jobs.enqueue(session, Hold(tag="pgb", seconds=5)).id
            session.commit()

        def effects() -> list[tuple[Any, ...]]:
            with clean.connect() as conn:
                return [
                    tuple(r)
                    for r in conn.execute(
                        text(
                            f"SELECT event, attempt, crashes, pid FROM {EFFECTS_TABLE} "
                            "WHERE job_id = :id ORDER BY seq"
                        ),
                        {"id": job_id},
                    )
                ]

        wait_for(effects, "the victim starts the job")
        victim.kill()
        killed_at = time.monotonic()
        rescuer = spawn(bouncer.url, *options, effects_url=migrated_url)

        def history() -> Any:
            with clean.connect() as conn:
                return conn.execute(
                    text("SELECT attempts, crashes FROM sqla_jobs_history WHERE id = :id"),
                    {"id": job_id},
                ).first()

        done = wait_for(history, "the job is rescued and completed", timeout=40)
        rescued_s = time.monotonic() - killed_at
        assert tuple(done) == (2, 1)
        pids = (victim.proc.pid, rescuer.proc.pid)
        assert effects() == [
            ("started", 1, 0, pids[0]),
            ("started", 2, 1, pids[1]),
            ("finished", 2, 1, pids[1]),
        ]
        assert "event=reaped" in rescuer.log
        assert rescuer.stop() == 0
    figures.record(lease_s=2, kill_to_completion_s=round(rescued_s, 2))


@injects("PgBouncer >= 1.21 with max_prepared_statements, transaction pooling")
def test_default_worker_runs_through_pgbouncer_that_tracks_prepared_statements(
    migrated_url: str, clean: Engine, handlers: Seen, figures: Figures
) -> None:
    """With PgBouncer 1.21+ tracking protocol-level prepared statements, a poll-only worker with
    its default settings (psycopg preparing statements) runs every job once."""
    with start_pgbouncer(migrated_url, max_prepared_statements=200) as tracking:
        n = scaled(200, 2000)
        with Session(clean) as session:
            ids = jobs.enqueue_many(session, [Ping(n=i) for i in range(n)])
            session.commit()
        workers = [
            Worker(jobs, tracking.url, listen=False, poll_interval=0.05, concurrency=4)
            for _ in range(2)
        ]
        with edge_app.running(*workers):
            wait_for(
                lambda: count(clean, "SELECT count(*) FROM sqla_jobs_job") == 0,
                "the workers drain the queue",
                timeout=60,
            )
    assert sorted(handlers.runs) == sorted(ids)
    assert set(handlers.runs.values()) == {1}
    figures.record(pgbouncer=".".join(map(str, tracking.version)), jobs=n)
