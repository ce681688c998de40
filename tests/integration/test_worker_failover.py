"""A worker whose database is demoted under it (a switchover: the primary turned read-only, its
sessions ended) and promoted again: no thread dies, the registry and the throughput go on, one
line says when the outage starts and one when it ends, and no job is charged for it.

The demotion is played on a database of the test's own: ``ALTER DATABASE ... SET
default_transaction_read_only`` makes every new session on it read-only (SQLSTATE 25006 on every
write, as on a standby or a primary turned read-only), and ``pg_terminate_backend`` ends the
sessions it had (57P01, as a shutdown does). Nothing of the shared server's configuration changes.
The failover harness plays it again with a real standby promoted.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, Worker
from sqla_jobs.db.outage import OUTAGE
from sqla_jobs.db.urls import libpq_conninfo, parse_url, sqlalchemy_url
from sqla_jobs.enqueue.notifier import Notifier
from sqla_jobs.worker.config import WorkerSeams
from tests._waiting import DEADLINE, wait_until
from tests.conftest import alembic_config, create_database, drop_database
from tests.integration._listening import ARRIVES, Heard
from tests.integration._workers import running_workers

#: What a worker may log at WARNING or above, at most, for one demotion and promotion.
MAX_OUTAGE_LINES = 4


class Ping(BaseModel):
    n: int


@pytest.fixture(scope="module")
def own_url(server_url: str) -> Iterator[str]:
    """A migrated database of this module's own: it is made read-only and writable again."""
    url = create_database(server_url, prefix="sqla_jobs_failover")
    try:
        command.upgrade(alembic_config(url), "head")
        yield url
    finally:
        drop_database(server_url, url)


@pytest.fixture
def own_engine(own_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(own_url), pool_pre_ping=True)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_job, sqla_jobs_worker, sqla_jobs_throughput"))
        conn.execute(text("CREATE TABLE IF NOT EXISTS app_effect (job_id bigint NOT NULL)"))
        conn.execute(text("TRUNCATE app_effect"))
    yield engine
    engine.dispose()


class Server:
    """Demotes and promotes the database ``url`` names, from a session on another database."""

    def __init__(self, server_url: str, url: str) -> None:
        self.name = parse_url(url).database
        self.admin = psycopg.connect(libpq_conninfo(server_url), autocommit=True)

    def demote(self) -> None:
        self.admin.execute(f'ALTER DATABASE "{self.name}" SET default_transaction_read_only = on')
        self.terminate()

    def promote(self) -> None:
        self.admin.execute(f'ALTER DATABASE "{self.name}" RESET default_transaction_read_only')
        self.admin.execute(f'ALTER DATABASE "{self.name}" RESET search_path')

    def refuse_notify(self, engine: Engine) -> None:
        """New sessions' ``pg_notify`` refused as a standby refuses it (25006): a function of
        that name in a schema searched before pg_catalog."""
        with engine.begin() as conn:
            conn.execute(text("CREATE SCHEMA IF NOT EXISTS standby_sim"))
            conn.execute(
                text(
                    "CREATE OR REPLACE FUNCTION standby_sim.pg_notify(text, text) RETURNS void "
                    "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
                    "'cannot execute NOTIFY during recovery' USING ERRCODE = '25006'; END $$"
                )
            )
        self.admin.execute(
            f'ALTER DATABASE "{self.name}" SET search_path = standby_sim, pg_catalog'
        )

    def terminate(self, pid: int | None = None, *, like: str = "%") -> None:
        if pid is None:
            self.admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() AND application_name LIKE %s",
                (self.name, like),
            )
        else:
            self.admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def close(self) -> None:
        self.promote()
        self.admin.close()


@pytest.fixture
def server(server_url: str, own_url: str) -> Iterator[Server]:
    made = Server(server_url, own_url)
    try:
        yield made
    finally:
        made.close()


def enqueue(engine: Engine, jobs: Jobs, n: int) -> None:
    with Session(engine) as session, session.begin():
        jobs.enqueue_many(session, [Ping(n=i) for i in range(n)])


def said(records: list[logging.LogRecord]) -> list[str]:
    """The lines an operator sees (WARNING and above) of sqla-jobs, with their thread."""
    return [
        f"{r.threadName}: {r.getMessage()}"
        for r in records
        if r.levelno >= logging.WARNING and r.name.startswith("sqla_jobs")
    ]


def met_read_only(caplog: pytest.LogCaptureFixture, thread: str) -> bool:
    return any(
        r.threadName.startswith(thread) and "read-only" in r.getMessage() for r in caplog.records
    )


def test_a_worker_rides_out_a_demoted_primary_without_a_thread_dying_or_going_quiet(
    own_engine: Engine, own_url: str, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sqla_jobs")
    jobs = Jobs()
    done: list[int] = []

    @jobs.kind("ping", Ping, queue="failover")
    def ping(payload: Ping, ctx: JobContext) -> None:
        done.append(payload.n)

    with running_workers(
        jobs,
        own_url,
        queues=["failover"],
        lease=3.0,
        heartbeat=0.5,
        reap_interval=0.2,
        poll_interval=0.2,
    ) as [worker]:
        enqueue(own_engine, jobs, 3)
        wait_until(lambda: len(done) == 3, what="three jobs done before the demotion")
        reaper, registry, tally = worker.reaper, worker.monitor.registry, worker.monitor.tally
        assert reaper is not None
        assert tally is not None
        before = len(caplog.records)
        server.demote()
        for thread in ("sqla-jobs-reaper", "sqla-jobs-leases"):
            wait_until(
                lambda thread=thread: met_read_only(caplog, thread) or not reaper.is_alive(),
                what=f"{thread} met the read-only server",
            )
        assert reaper.is_alive(), "the reaper thread died on the read-only server"
        server.promote()
        passes = reaper.passes
        enqueue(own_engine, jobs, 3)
        wait_until(lambda: len(done) == 6, what="three jobs done after the promotion")
        wait_until(lambda: reaper.passes > passes + 2, what="the reaper reaping again")
        wait_until(lambda: not OUTAGE.active, what="the outage over")
        assert registry.enabled, "the registry took the read-only server for a missing grant"
        assert tally.enabled, "the tally took the read-only server for a missing grant"
        with own_engine.connect() as conn:
            beat = conn.execute(
                text("SELECT expires_at > now() FROM sqla_jobs_worker WHERE name = :n"),
                {"n": worker.name},
            ).scalar_one()
        assert beat, "the registry row is not beaten any more"
    records = caplog.records[before:]
    tracebacks = [r.getMessage() for r in records if r.exc_info is not None]
    assert tracebacks == [], "a retry logged a traceback"
    outage = said(records)
    assert len(outage) <= MAX_OUTAGE_LINES, "\n".join(outage)
    assert any("database back" in line for line in outage), "\n".join(outage)


def test_a_session_run_that_meets_a_failover_is_not_charged_an_attempt(
    own_engine: Engine, own_url: str, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """max_attempts=1: a run whose Session met AdminShutdown would be dead if charged. It goes
    back to the queue instead, and its effect is written once, by the run that completes."""
    jobs = Jobs()
    pids: queue.Queue[int] = queue.Queue()
    go_on = threading.Event()
    runs: list[int] = []

    @jobs.kind("effect", Ping, queue="failover", max_attempts=1)
    def effect(payload: Ping, ctx: JobContext, session: Session) -> None:
        runs.append(ctx.job_id)
        session.execute(text("INSERT INTO app_effect VALUES (:id)"), {"id": ctx.job_id})
        if len(runs) == 1:
            pids.put(int(session.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            go_on.wait(60)
            session.execute(text("SELECT 1"))  # the server ended this session meanwhile

    enqueue(own_engine, jobs, 1)
    with running_workers(jobs, own_url, queues=["failover"], poll_interval=0.2) as [worker]:
        server.terminate(pids.get(timeout=60))
        go_on.set()
        wait_until(
            lambda: worker.counts["done"] + worker.counts["dead"] + worker.counts["failed"] > 0,
            what="the job's run ended",
        )
        assert (worker.counts["dead"], worker.counts["failed"]) == (0, 0), "charged an attempt"
        wait_until(lambda: worker.counts["done"] == 1, what="the job done on its second run")
    assert len(runs) == 2
    with own_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM app_effect")).scalar_one() == 1
        assert conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar_one() == 0


def test_the_notifier_leaves_a_server_that_refuses_its_wakeups_as_a_standby_does(
    own_engine: Engine, own_url: str, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Its connection lands on a server that refuses pg_notify with 25006: the notifier drops
    that connection and sends again on a new one, which reaches the primary once there is one
    (it used to drop the wakeups and keep the connection, refused forever)."""
    channel = Jobs().channel
    heard = Heard(own_url, channel)
    notifier = Notifier(libpq_conninfo(own_url))
    notifier.start()
    try:
        notifier.send([(channel, "before")])
        assert heard.within(ARRIVES) == ["before"]
        server.refuse_notify(own_engine)
        server.terminate(like="sqla-jobs notifier %")
        notifier.send([(channel, "refused")])

        def refused() -> bool:
            # The refusal is answered on a new session: it is seen idle after its pg_notify
            # (a notifier that keeps it), or the notifier connects once more (one that leaves).
            sessions = server.admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state = 'idle' "
                "AND application_name LIKE 'sqla-jobs notifier %%' AND query LIKE '%%pg_notify%%'",
                (server.name,),
            ).fetchone()
            return notifier.connects >= 3 or (sessions is not None and sessions[0] > 0)

        wait_until(lambda: notifier.connects >= 2, what="the notifier connected again")
        wait_until(refused, what="the wakeup refused on the notifier's new session")
        server.promote()
        notifier.send([(channel, "after")])
        got: list[str] = []
        wait_until(
            lambda: got.extend(heard.within(1.0)) or "after" in got,
            what="the wakeup sent after the promotion heard",
        )
        assert notifier.is_alive()
    finally:
        notifier.stop()
        notifier.join(10)
        heard.close()


def test_the_reaper_back_from_an_outage_longer_than_the_lease_lets_heartbeats_renew_first(
    own_engine: Engine, own_url: str, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The database is read-only past a running job's lease; once it takes writes again the
    reaper, back first (the heartbeats are held until it has made passes), waits a lease before
    it reaps, so the live worker's heartbeat renews the lease: no crash, the job completes once."""
    caplog.set_level(logging.DEBUG, logger="sqla_jobs")
    jobs = Jobs()
    release = threading.Event()
    paused = threading.Event()

    @jobs.kind("long", Ping, queue="failover")
    def long(payload: Ping, ctx: JobContext) -> None:
        release.wait(120)

    def expired() -> bool:
        with own_engine.connect() as conn:
            return bool(
                conn.execute(
                    text("SELECT bool_and(lease_expires_at < now()) FROM sqla_jobs_job")
                ).scalar_one()
            )

    enqueue(own_engine, jobs, 1)
    # The reaper's grace (a lease and the slowest heartbeat's reconnect) outlasts the passes below.
    with running_workers(
        jobs, own_url, queues=["failover"], lease=6.0, heartbeat=0.5, reap_interval=0.2,
        poll_interval=0.2, seams=WorkerSeams(heartbeats_paused=paused),
    ) as [worker]:  # fmt: skip
        reaper = worker.reaper
        assert reaper is not None
        wait_until(lambda: worker.counts["claimed"] == 1, what="the job running")
        paused.set()
        server.demote()
        wait_until(lambda: met_read_only(caplog, "sqla-jobs-reaper"), what="the reaper cut off")
        wait_until(expired, what="the running job's lease expired during the outage")
        server.promote()
        wait_until(lambda: not OUTAGE.active, what="the reaper back on a writable server")
        passes = reaper.passes
        wait_until(lambda: reaper.passes >= passes + 3, what="the reaper's passes after the outage")
        paused.clear()
        wait_until(lambda: not expired(), what="the heartbeat renewed the expired lease")
        release.set()
        wait_until(lambda: worker.counts["done"] == 1, what="the job done")
        assert reaper.reaped == 0, "the reaper reaped a live worker's job after the outage"
    assert not [r for r in caplog.records if getattr(r, "event", None) == "reaped"]
    with own_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar_one() == 0


def test_a_worker_started_on_a_read_only_database_waits_then_starts_once_it_takes_writes(
    own_engine: Engine, own_url: str, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process, on a database turned read-only before the worker starts (a switchover's
    first step): the worker waits, says why, and runs the job once the database takes writes"""
    caplog.set_level(logging.DEBUG, logger="sqla_jobs")
    jobs = Jobs()
    done: list[int] = []

    @jobs.kind("ping", Ping, queue="failover")
    def ping(payload: Ping, ctx: JobContext) -> None:
        done.append(payload.n)

    enqueue(own_engine, jobs, 1)
    server.demote()
    worker = Worker(jobs, own_url, queues=["failover"], poll_interval=0.2)
    thread = threading.Thread(
        target=worker.run_sync, kwargs={"install_signal_handlers": False}, daemon=True
    )
    thread.start()
    try:
        # The process's outage account may be on already (an earlier test's): then the line is
        # at DEBUG, with the same event.
        wait_until(
            lambda: any(getattr(r, "event", None) == "no_primary" for r in caplog.records),
            what="the worker waiting for a primary",
        )
        assert not worker.started.is_set()
        assert thread.is_alive()
        server.promote()
        wait_until(lambda: done == [0], what="the job run once the database takes writes")
    finally:
        worker.stop()
        thread.join(DEADLINE)
    waiting = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "no_primary"]
    assert "read-only" in waiting[0], waiting
