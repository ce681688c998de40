"""Least privilege: the roles and grants of docs/roles.md, run as written, on a real PostgreSQL.

The SQL blocks of the page are executed with the role and schema names replaced by unique ones for
this run (roles are cluster-wide), then each role does its job and is refused what it must not do:
the owner migrates without superuser, the enqueuer adds jobs (and replaces a pending unique one)
but cannot change their state, the worker runs them (skipping paused queues) and enqueues the ticks
of periodic schedules but cannot change the schema, the operator retries, cancels and pauses queues
and schedules but cannot enqueue, the reader runs ``sqla-jobs stats`` and lists the schedules but
cannot write. A handler's Session on the application's own role completes its job with the page's
grants for it, and without any one of them fails the attempt, its writes rolled back, and is
retried. The roles and the schema are dropped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from sqla_jobs import (
    ConfigurationError,
    DuplicateJobError,
    JobContext,
    Jobs,
    OnConflict,
    RateLimit,
    Retention,
    Unique,
    Worker,
    testing,
)
from sqla_jobs.db.connections import Connector
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
from sqla_jobs.enqueue.insert import CHUNK, COPY_THRESHOLD
from sqla_jobs.migrate import upgrade
from sqla_jobs.observe import stats
from sqla_jobs.worker.pruner import EDGES, RATE_LIMITERS, Pruner
from tests.reliability import edge_app
from tests.reliability.conftest import Figures, injects
from tests.reliability.edge_app import wait_for, wait_running

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "roles.md"
ROLES = ("owner", "enqueuer", "worker", "operator", "reader")
#: The first line of each SQL block of the page that the tests run.
SUPERUSER_BLOCK = "-- as a superuser"
OWNER_BLOCK = "-- as jobs_owner, after every migration"
STRICT_BLOCK = "-- optional, stricter worker grants"


def sql_blocks(markdown: str) -> dict[str, str]:
    """The page's ```sql blocks, by their first line."""
    blocks = re.findall(r"```sql\n(.*?)```", markdown, flags=re.DOTALL)
    return {block.splitlines()[0]: block for block in blocks}


def statements_of(block: str) -> list[str]:
    """The statements of a block (no comments; statements end with ``;``)."""
    body = "\n".join(line for line in block.splitlines() if not line.startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


@dataclass
class Roles:
    """This run's names for the page's roles and schema, and how to connect as each."""

    suffix: str
    password: str
    server_url: str
    names: dict[str, str] = field(default_factory=dict)

    @property
    def schema(self) -> str:
        return f"jobs_{self.suffix}"

    def name(self, role: str) -> str:
        return f"jobs_{role}_{self.suffix}"

    def localize(self, sql: str) -> str:
        """The page's SQL with this run's names and password."""

        def rename(found: re.Match[str]) -> str:
            role = found.group(1)
            return self.name(role[1:]) if role else self.schema

        sql = re.sub(r"\bjobs(_owner|_enqueuer|_worker|_operator|_reader)?\b", rename, sql)
        sql = re.sub(r"\bapp_user\b", self.app_user, sql)
        return sql.replace("'change-me'", f"'{self.password}'")

    @property
    def app_user(self) -> str:
        """The application's own role (the page's ``app_user``): handlers' Sessions log in as it."""
        return f"app_user_{self.suffix}"

    def url(self, role: str) -> str:
        """A URL of the test database that logs in as ``role``."""
        return self.url_of(self.name(role))

    def url_of(self, name: str) -> str:
        """A URL of the test database that logs in as the role ``name``."""
        return (
            make_url(sqlalchemy_url(self.server_url))
            .set(username=name, password=self.password)
            .render_as_string(hide_password=False)
        )

    def engine(self, role: str) -> Engine:
        return create_engine(self.url(role), poolclass=NullPool)


def run_as(url: str, statements: list[str]) -> None:
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def doc_sql() -> dict[str, str]:
    return sql_blocks(DOC.read_text())


@pytest.fixture(scope="module")
def roles(migrated_url: str, doc_sql: dict[str, str]) -> Iterator[Roles]:
    """The page's roles and schema, created and migrated as the page says; dropped afterwards."""
    r = Roles(secrets.token_hex(4), secrets.token_urlsafe(12), migrated_url)
    superuser = [b for first, b in doc_sql.items() if first.startswith(SUPERUSER_BLOCK)]
    assert len(superuser) == 1, "docs/roles.md has one superuser block"
    try:
        run_as(migrated_url, statements_of(r.localize(superuser[0])))
        upgrade(r.url("owner"), schema=r.schema)
        run_as(r.url("owner"), statements_of(r.localize(doc_sql[OWNER_BLOCK])))
        yield r
    finally:
        names = [r.name(role) for role in ROLES]
        with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
                (names,),
            )
            conn.execute(f'DROP SCHEMA IF EXISTS "{r.schema}" CASCADE')
            for name in names:
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
                if exists.fetchone():
                    conn.execute(f'REASSIGN OWNED BY "{name}" TO CURRENT_USER')
                    conn.execute(f'DROP OWNED BY "{name}"')
                    conn.execute(f'DROP ROLE "{name}"')


class Greet(BaseModel):
    n: int


class Wobbly(BaseModel):
    n: int


@dataclass
class App:
    """The application, with its table in the run's schema, and what its handlers did."""

    jobs: Jobs
    done: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def make_app(schema: str) -> App:
    app = App(Jobs(schema=schema))

    @app.jobs.kind("roles_greet", Greet, queue="roles")
    def greet(args: Greet, ctx: JobContext) -> None:
        ctx.step("greeted", lambda: args.n)
        threading.Event().wait(0.3)  # long enough for a heartbeat
        with app.lock:
            app.done.append(ctx.job_id)

    @app.jobs.kind("roles_wobbly", Wobbly, queue="roles")
    def wobbly(args: Wobbly, ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        with app.lock:
            app.done.append(ctx.job_id)

    return app


def refused(action: Callable[[], Any]) -> str:
    """Run ``action``, which must be refused for lack of privilege; return the server's message."""
    with pytest.raises((DBAPIError, psycopg.Error)) as caught:
        action()
    exc = caught.value
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    assert isinstance(orig, pg_errors.InsufficientPrivilege), f"not a privilege error: {exc!r}"
    return str(orig).splitlines()[0]


def count(engine: Engine, sql: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def execute_as(engine: Engine, sql: str) -> Callable[[], Any]:
    def run() -> None:
        with engine.begin() as conn:
            conn.execute(text(sql))

    return run


@injects("non-superuser roles with the grants of docs/roles.md")
def test_schema_owner_runs_the_migrations_without_superuser(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The owner role, no superuser, runs the migrations into its schema and owns the tables."""
    with engine.connect() as conn:
        superuser = conn.execute(
            text("SELECT rolsuper FROM pg_roles WHERE rolname = :r"), {"r": roles.name("owner")}
        ).scalar_one()
        owners = dict(
            conn.execute(
                text(
                    "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = :s "
                    "ORDER BY tablename"
                ),
                {"s": roles.schema},
            ).all()
        )
    assert superuser is False
    assert owners == dict.fromkeys(
        (
            "sqla_jobs_alembic_version",
            "sqla_jobs_dependency",
            "sqla_jobs_history",
            "sqla_jobs_job",
            "sqla_jobs_outcome",
            "sqla_jobs_queue",
            "sqla_jobs_schedule",
            "sqla_jobs_throughput",
            "sqla_jobs_rate_limiter",
            "sqla_jobs_worker",
        ),
        roles.name("owner"),
    )
    figures.record(tables_owned=len(owners))


#: enqueue_many's sizes: one INSERT, a COPY of one chunk, a COPY validated while it streams.
MANY_SIZES = (3, COPY_THRESHOLD, CHUNK + 1)


def enqueue_every_way(app: App, url: str) -> list[int]:
    """Every enqueue call, sync and async, as the role of ``url``: each in a transaction that
    enqueued a job first, which must commit with them. Returns the ids, in order."""
    ids: list[int] = []
    with Session(create_engine(url, poolclass=NullPool)) as session:
        one = app.jobs.enqueue(session, Greet(n=1))
        assert one.state == "pending"  # the whole row came back through RETURNING
        ids.append(one.id)
        for size in MANY_SIZES:
            ids += app.jobs.enqueue_many(session, [Greet(n=n) for n in range(size)])
        session.commit()

    async def in_async_session() -> list[int]:
        engine = create_async_engine(url, poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                got = [(await app.jobs.enqueue_async(session, Greet(n=1))).id]
                for size in MANY_SIZES:
                    payloads = [Greet(n=n) for n in range(size)]
                    got += await app.jobs.enqueue_many_async(session, payloads)
                await session.commit()
                return got
        finally:
            await engine.dispose()

    return ids + asyncio.run(in_async_session())


def stored_ids(engine: Engine, schema: str) -> list[int]:
    with engine.connect() as conn:
        return list(conn.scalars(text(f"SELECT id FROM {schema}.sqla_jobs_job ORDER BY id")))


@injects("non-superuser roles with the grants of docs/roles.md")
def test_enqueuer_adds_jobs_but_cannot_change_or_delete_them(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The enqueuer role makes every enqueue call (enqueue, enqueue_many by INSERT and by COPY,
    sync and async), and is refused UPDATE of a job's state, kind, queue or attempts, DELETE,
    TRUNCATE and the claim: it cannot change a job's state."""
    app = make_app(roles.schema)
    enqueuer = roles.engine("enqueuer")
    table = f"{roles.schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {table}"))
    ids = enqueue_every_way(app, roles.url("enqueuer"))
    assert stored_ids(engine, roles.schema) == ids
    assert len(ids) == 2 * (1 + sum(MANY_SIZES))

    messages = [
        refused(execute_as(enqueuer, f"UPDATE {table} SET state = 'dead'")),
        refused(execute_as(enqueuer, f"UPDATE {table} SET kind = 'other', queue = 'other'")),
        refused(execute_as(enqueuer, f"UPDATE {table} SET attempts = 99")),
        refused(execute_as(enqueuer, f"DELETE FROM {table}")),
        refused(execute_as(enqueuer, f"TRUNCATE {table}")),
        refused(execute_as(enqueuer, f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), 1)")),
    ]

    def claim() -> None:
        with Session(enqueuer) as session:
            testing.run_jobs(app.jobs, session)

    messages.append(refused(claim))
    assert app.done == []
    with engine.connect() as conn:
        states = conn.execute(
            text(f"SELECT DISTINCT state FROM {table} WHERE id = ANY(:ids)"), {"ids": ids}
        ).scalars()
        assert list(states) == ["pending"]
    enqueuer.dispose()
    figures.record(enqueued=len(ids), refused=len(messages))


@injects("the enqueuer without USAGE on the id sequence (the grants of an earlier release)")
def test_enqueuer_without_the_sequence_grant_still_makes_every_enqueue_call(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """An enqueuer granted only INSERT and SELECT on the table, as an earlier release of the page
    said: enqueue_many of a COPY's size falls back to one INSERT, which takes its ids from the
    identity under the table's INSERT privilege, and the caller's transaction is unharmed."""
    app = make_app(roles.schema)
    table = f"{roles.schema}.sqla_jobs_job"
    sequence = f"{roles.schema}.sqla_jobs_job_id_seq"
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {table}"))
    run_as(
        roles.url("owner"), [f"REVOKE USAGE ON SEQUENCE {sequence} FROM {roles.name('enqueuer')}"]
    )
    try:
        ids = enqueue_every_way(app, roles.url("enqueuer"))
    finally:
        run_as(
            roles.url("owner"), [f"GRANT USAGE ON SEQUENCE {sequence} TO {roles.name('enqueuer')}"]
        )
    assert stored_ids(engine, roles.schema) == ids
    figures.record(enqueued=len(ids))


@injects("a role with INSERT but no SELECT on the queue table")
def test_enqueue_needs_select_because_it_returns_the_inserted_row(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """Without SELECT, enqueue is refused: its INSERT ... RETURNING returns the whole row. This is
    why the page grants the enqueuer SELECT."""
    app = make_app(roles.schema)
    name = f"jobs_insert_only_{roles.suffix}"
    table = f"{roles.schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {name} LOGIN PASSWORD '{roles.password}'"))
        conn.execute(text(f"GRANT USAGE ON SCHEMA {roles.schema} TO {name}"))
        conn.execute(text(f"GRANT INSERT ON {table} TO {name}"))
    url = make_url(roles.url("enqueuer")).set(username=name)
    insert_only = create_engine(url, poolclass=NullPool)
    try:

        def enqueue() -> None:
            with Session(insert_only) as session:
                app.jobs.enqueue(session, Greet(n=1))
                session.commit()

        message = refused(enqueue)
        assert "sqla_jobs_job" in message
    finally:
        insert_only.dispose()
        with engine.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {name}"))
            conn.execute(text(f"DROP ROLE {name}"))
    figures.record(refused=message)


@injects("non-superuser roles with the grants of docs/roles.md")
def test_worker_role_runs_jobs_but_cannot_change_the_schema(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """A Worker connected as the worker role claims, heartbeats, records steps, fails, retries,
    completes into history and reaps; it is refused DDL (CREATE TABLE, ALTER, DROP, TRUNCATE,
    CREATE INDEX), resuming a queue an operator paused, and deleting a schedule."""
    figures.record(**run_worker_as(roles, engine, "worker"))
    worker = roles.engine("worker")
    table = f"{roles.schema}.sqla_jobs_job"
    messages = [
        refused(execute_as(worker, f"CREATE TABLE {roles.schema}.worker_table (id int)")),
        refused(execute_as(worker, f"ALTER TABLE {table} ADD COLUMN extra int")),
        refused(execute_as(worker, f"ALTER TABLE {table} SET (autovacuum_enabled = false)")),
        refused(execute_as(worker, f"DROP TABLE {table}")),
        refused(execute_as(worker, f"TRUNCATE {table}")),
        refused(execute_as(worker, f"CREATE INDEX worker_idx ON {table} (kind)")),
        refused(execute_as(worker, f"UPDATE {roles.schema}.sqla_jobs_queue SET paused_at = NULL")),
        refused(execute_as(worker, f"DELETE FROM {roles.schema}.sqla_jobs_schedule")),
    ]
    worker.dispose()
    assert any("must be owner" in m for m in messages)


def run_worker_as(roles: Roles, engine: Engine, role: str) -> dict[str, Any]:
    """Run a Worker as ``role`` over jobs that exercise every worker statement; return figures."""
    app = make_app(roles.schema)
    table = f"{roles.schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {table}, {roles.schema}.sqla_jobs_history"))
    with Session(engine) as session:
        greet_ids = app.jobs.enqueue_many(session, [Greet(n=i) for i in range(3)])
        wobbly_id = app.jobs.enqueue(session, Wobbly(n=1)).id
        # A job whose worker vanished: running, under a lease that has expired.
        crashed_id = app.jobs.enqueue(session, Greet(n=99)).id
        session.flush()
        session.execute(
            text(
                f"UPDATE {table} SET state = 'running', attempts = 1, "
                "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second', "
                "locked_by = 'vanished' WHERE id = :id"
            ),
            {"id": crashed_id},
        )
        session.commit()
    worker = Worker(
        app.jobs,
        roles.url(role),
        lease=1.5,
        heartbeat=0.1,
        poll_interval=0.1,
        keep_history=True,
    )

    def wobbly_failed() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    text(f"SELECT attempts FROM {table} WHERE id = :id AND state = 'pending'"),
                    {"id": wobbly_id},
                ).scalar()
            )

    registry = f"{roles.schema}.sqla_jobs_worker"
    with edge_app.running(worker):
        # Registered at its start, by its own role.
        assert count(engine, f"SELECT count(*) FROM {registry} WHERE name = '{worker.name}'") == 1
        wait_for(wobbly_failed, "the failure is recorded")
        with engine.begin() as conn:
            conn.execute(
                text(f"UPDATE {table} SET run_at = now() WHERE id = :id"), {"id": wobbly_id}
            )
        wait_for(lambda: len(app.done) == 5, "every job is done")
        wait_for(lambda: count(engine, f"SELECT count(*) FROM {table}") == 0, "all written")
    assert worker.reaper is not None
    assert worker.monitor.registry.enabled, "the registry was refused"
    assert worker.monitor.tally is not None
    assert worker.monitor.tally.enabled, "the throughput counts were refused"
    done = f"SELECT coalesce(sum(completed), 0) FROM {roles.schema}.sqla_jobs_throughput"
    assert count(engine, done) >= 5, "the worker's role wrote its throughput"
    assert count(engine, f"SELECT count(*) FROM {registry} WHERE name = '{worker.name}'") == 0
    with engine.connect() as conn:
        history = dict(
            conn.execute(text(f"SELECT id, attempts FROM {roles.schema}.sqla_jobs_history")).all()
        )
    assert history == {**dict.fromkeys(greet_ids, 1), wobbly_id: 2, crashed_id: 2}
    return {
        "role": role,
        "done": len(app.done),
        "reaped": worker.reaper.reaped,
        "failed": worker.counts["failed"],
    }


@injects("non-superuser roles with the stricter worker grants of docs/roles.md")
def test_worker_runs_with_update_narrowed_to_the_columns_it_writes(
    roles: Roles, engine: Engine, doc_sql: dict[str, str], figures: Figures
) -> None:
    """With the page's stricter grants (UPDATE on the lease and state columns only) the worker
    still runs every statement and enqueues the ticks of a schedule, and is refused changing a
    job's payload."""
    strict = [b for first, b in doc_sql.items() if first.startswith(STRICT_BLOCK)]
    assert len(strict) == 1
    run_as(roles.url("owner"), statements_of(roles.localize(strict[0])))
    try:
        figures.record(**run_worker_as(roles, engine, "worker"))
        ticks = run_ticks_as(roles, engine, "worker")
        figures.record(ticks_run=ticks["ticks_run"], ticks_enqueued=ticks["ticks_enqueued"])
        worker = roles.engine("worker")
        table = f"{roles.schema}.sqla_jobs_job"
        refused(execute_as(worker, f"UPDATE {table} SET payload = '{{}}'"))
        refused(execute_as(worker, f"UPDATE {table} SET kind = 'other'"))
        worker.dispose()
    finally:
        run_as(roles.url("owner"), statements_of(roles.localize(doc_sql[OWNER_BLOCK])))


@injects("non-superuser roles with the grants of docs/roles.md")
def test_reader_runs_sqla_jobs_stats_but_cannot_write(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """``sqla-jobs stats`` runs as the reader role and shows the queue; the reader is refused
    INSERT, UPDATE, DELETE and enqueue."""
    app = make_app(roles.schema)
    table = f"{roles.schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {table}"))
    with Session(engine) as session:
        app.jobs.enqueue_many(session, [Greet(n=i) for i in range(4)], delay=3600)
        session.commit()
    env = edge_app.worker_env(roles.url("reader"), None, None)
    done = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", "stats", "--schema", roles.schema],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    roles_line = next(line for line in done.stdout.splitlines() if line.startswith("roles "))
    assert roles_line.split()[1] == "4"
    assert "table sqla_jobs_job:" in done.stdout
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {roles.schema}.sqla_jobs_worker "
                "(name, host, pid, queues, concurrency, expires_at) "
                "VALUES ('reader-sees-me', 'h', 1, '{roles}', 2, now() + interval '1 minute')"
            )
        )
    listed = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.cli", "workers", "--schema", roles.schema, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert '"name": "reader-sees-me"' in listed.stdout

    reader = roles.engine("reader")
    messages = [
        refused(execute_as(reader, f"INSERT INTO {table} (kind, payload) VALUES ('x', '{{}}')")),
        refused(execute_as(reader, f"UPDATE {table} SET state = 'dead'")),
        refused(execute_as(reader, f"DELETE FROM {table}")),
        refused(execute_as(reader, f"DELETE FROM {roles.schema}.sqla_jobs_worker")),
        refused(execute_as(reader, f"DELETE FROM {roles.schema}.sqla_jobs_throughput")),
    ]

    def enqueue() -> None:
        with Session(reader) as session:
            app.jobs.enqueue(session, Greet(n=1))
            session.commit()

    messages.append(refused(enqueue))
    reader.dispose()
    figures.record(refused=len(messages))


@injects("a transaction held open by another role; the reader with and without pg_read_all_stats")
def test_reader_sees_another_roles_old_transaction_through_pg_read_all_stats(
    roles: Roles, engine: Engine, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stats run as the reader warn about another role's old transaction thanks to
    pg_read_all_stats; without it the transaction is invisible (why the page grants it)."""
    monkeypatch.setattr(stats, "OLD_TRANSACTION", timedelta(0))
    with psycopg.connect(libpq_conninfo(migrated_url)) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")
        pid = holder.info.backend_pid

        with engine.connect() as conn:
            holder_age = conn.execute(
                text("SELECT now() - xact_start FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            ).scalar_one()

        # With pg_read_all_stats: the warning names the holder (or an even older transaction of
        # some other session of this shared server).
        seen = stats.collect(roles.url("reader"), schema=roles.schema)
        assert seen.warnings
        assert seen.oldest_transaction is not None
        assert seen.oldest_transaction["pid"] == pid or seen.oldest_transaction["age"] >= holder_age
        assert any(f"pid {seen.oldest_transaction['pid']}," in w for w in seen.warnings)

        with engine.begin() as conn:
            conn.execute(text(f"REVOKE pg_read_all_stats FROM {roles.name('reader')}"))
        try:
            blind = stats.collect(roles.url("reader"), schema=roles.schema)
        finally:
            with engine.begin() as conn:
                conn.execute(text(f"GRANT pg_read_all_stats TO {roles.name('reader')}"))
        # Without it, other roles' transactions show no start time (query: "<insufficient
        # privilege>"), so there is no age to warn about.
        assert blind.oldest_transaction is None or blind.oldest_transaction["age"] is None
        assert blind.warnings == []
        holder.rollback()


def dead_and_pending(engine: Engine, app: App, schema: str) -> tuple[int, int]:
    """A dead job (set by hand) and a pending one not yet due, committed; the table emptied
    first."""
    table = f"{schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(
            text(
                f"TRUNCATE {table}, {schema}.sqla_jobs_history, {schema}.sqla_jobs_queue, "
                f"{schema}.sqla_jobs_schedule"
            )
        )
    with Session(engine) as session:
        dead = app.jobs.enqueue(session, Greet(n=1)).id
        pending = app.jobs.enqueue(session, Greet(n=2), delay=3600).id
        session.commit()
    with engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE {table} SET state = 'dead', attempts = 3, finished_at = now() WHERE id = :id"
            ),
            {"id": dead},
        )
    return dead, pending


def states_of(engine: Engine, schema: str, ids: list[int]) -> list[str]:
    with engine.connect() as conn:
        found = dict(
            conn.execute(
                text(f"SELECT id, state FROM {schema}.sqla_jobs_job WHERE id = ANY(:ids)"),
                {"ids": ids},
            ).all()
        )
    return [found[i] for i in ids]


@injects("non-superuser roles with the grants of docs/roles.md")
def test_operator_retries_cancels_and_pauses_but_cannot_enqueue(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The operator role retries a dead job, cancels a pending one, pauses and resumes a queue
    (sync and async), and reads the jobs; it is refused INSERT of jobs and DDL."""
    app = make_app(roles.schema)
    dead, pending = dead_and_pending(engine, app, roles.schema)
    operator = roles.engine("operator")
    with Session(operator) as session, session.begin():
        assert app.jobs.retry(session, [dead]) == [dead]
        assert app.jobs.cancel(session, [pending]).cancelled == [pending]
        app.jobs.pause_queue(session, "roles")
        fetched = app.jobs.get(session, dead)
        assert fetched is not None
        assert fetched.state == "pending"
    assert states_of(engine, roles.schema, [dead, pending]) == ["pending", "cancelled"]
    with engine.connect() as conn:
        paused = conn.execute(
            text(
                f"SELECT paused_at IS NOT NULL FROM {roles.schema}.sqla_jobs_queue WHERE queue = 'roles'"
            )
        ).scalar_one()
    assert paused is True

    async def resume() -> None:
        async_engine = create_async_engine(roles.url("operator"), poolclass=NullPool)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                await app.jobs.resume_queue_async(session, "roles")
                assert await app.jobs.retry_async(session, [pending]) == [pending]
        finally:
            await async_engine.dispose()

    asyncio.run(resume())
    assert states_of(engine, roles.schema, [pending]) == ["pending"]
    table = f"{roles.schema}.sqla_jobs_job"

    def enqueue() -> None:
        with Session(operator) as session:
            app.jobs.enqueue(session, Greet(n=1))
            session.commit()

    messages = [
        refused(enqueue),
        refused(execute_as(operator, f"ALTER TABLE {table} ADD COLUMN extra int")),
        refused(execute_as(operator, f"TRUNCATE {table}")),
        refused(execute_as(operator, f"DELETE FROM {roles.schema}.sqla_jobs_worker")),
    ]
    # The live workers and the throughput counts (the dashboard): read, never written.
    assert count(operator, f"SELECT count(*) FROM {roles.schema}.sqla_jobs_worker") >= 0
    assert count(operator, f"SELECT count(*) FROM {roles.schema}.sqla_jobs_throughput") >= 0
    messages.append(
        refused(execute_as(operator, f"DELETE FROM {roles.schema}.sqla_jobs_throughput"))
    )
    # Prune: finished jobs and history rows, by DELETE.
    execute_as(operator, f"DELETE FROM {table} WHERE state = 'cancelled'")()
    execute_as(operator, f"DELETE FROM {roles.schema}.sqla_jobs_history")()
    operator.dispose()
    figures.record(refused=len(messages))


@injects("non-superuser roles with the grants of docs/roles.md")
def test_enqueuer_cannot_cancel_retry_or_pause_and_the_refusal_aborts_its_transaction(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The enqueuer is refused cancel, retry and pause (permission denied, a database error, not
    an OperationError). The refusal aborts the caller's transaction: what it enqueued before is
    lost once it rolls back, as docs/roles.md says."""
    app = make_app(roles.schema)
    dead, pending = dead_and_pending(engine, app, roles.schema)
    enqueuer = roles.engine("enqueuer")
    table = f"{roles.schema}.sqla_jobs_job"
    actions: dict[str, Callable[[Session], Any]] = {
        "cancel": lambda session: app.jobs.cancel(session, [pending]),
        "retry": lambda session: app.jobs.retry(session, [dead]),
        "pause": lambda session: app.jobs.pause_queue(session, "roles"),
    }
    messages: list[str] = []
    for name, action in actions.items():
        with Session(enqueuer) as session:
            enqueued = app.jobs.enqueue(session, Greet(n=7)).id

            def attempt(
                session: Session = session, action: Callable[[Session], Any] = action
            ) -> None:
                action(session)

            messages.append(refused(attempt))
            with pytest.raises(DBAPIError) as caught:
                session.execute(text("SELECT 1"))
            assert isinstance(caught.value.orig, pg_errors.InFailedSqlTransaction), name
            session.rollback()
        assert count(engine, f"SELECT count(*) FROM {table} WHERE id = {enqueued}") == 0, name
    assert states_of(engine, roles.schema, [dead, pending]) == ["dead", "pending"]
    enqueuer.dispose()
    figures.record(refused=len(messages))


@injects("non-superuser roles with the grants of docs/roles.md")
def test_reader_reads_jobs_and_queues_but_cannot_retry_or_cancel(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The reader (a read-only dashboard) reads the jobs, the history, the paused queues and the
    schedules, and is refused retry and cancel."""
    app = make_app(roles.schema)
    dead, pending = dead_and_pending(engine, app, roles.schema)
    reader = roles.engine("reader")
    for table in ("sqla_jobs_job", "sqla_jobs_history", "sqla_jobs_queue", "sqla_jobs_schedule"):
        assert count(reader, f"SELECT count(*) FROM {roles.schema}.{table}") is not None

    def retry() -> None:
        with Session(reader) as session:
            app.jobs.retry(session, [dead])

    def cancel() -> None:
        with Session(reader) as session:
            app.jobs.cancel(session, [pending])

    messages = [refused(retry), refused(cancel)]
    assert states_of(engine, roles.schema, [dead, pending]) == ["dead", "pending"]
    reader.dispose()
    figures.record(refused=len(messages))


@injects("non-superuser roles with the grants of docs/roles.md; a queue paused by the operator")
def test_worker_role_skips_a_queue_the_operator_paused_until_it_is_resumed(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The worker role's claim reads sqla_jobs_queue: a queue the operator paused is not
    claimed, and its job runs once the operator resumes it."""
    app = make_app(roles.schema)
    table = f"{roles.schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {table}, {roles.schema}.sqla_jobs_queue"))
    operator = roles.engine("operator")
    with Session(operator) as session, session.begin():
        app.jobs.pause_queue(session, "roles")
    with Session(engine) as session:
        job_id = app.jobs.enqueue(session, Wobbly(n=1)).id
        session.commit()
    worker = Worker(app.jobs, roles.url("worker"), poll_interval=0.1)
    with edge_app.running(worker):
        wait_for(lambda: worker.wakeups is not None and worker.wakeups.drained, "polled")
        wait_for(lambda: worker.wakeups is not None and worker.wakeups.drained, "polled again")
        assert states_of(engine, roles.schema, [job_id]) == ["pending"]
        assert app.done == []
        with Session(operator) as session, session.begin():
            app.jobs.resume_queue(session, "roles")
        wait_for(lambda: worker.counts["failed"] == 1, "the job runs (its first attempt fails)")
    operator.dispose()
    figures.record(failed=worker.counts["failed"])


# -- periodic schedules and unique jobs ---------------------------------------------------------

#: The schedule of :func:`make_ticking_app`, named after its kind.
TICK = "roles_tick"


class Tick(BaseModel):
    """A tick's payload: nothing, as for most periodic jobs."""


def make_ticking_app(schema: str) -> App:
    """:func:`make_app` with a schedule: a ``roles_tick`` job every second, whose runs are
    recorded in ``done``."""
    app = make_app(schema)

    @app.jobs.periodic(every=timedelta(seconds=1))
    @app.jobs.kind(TICK, Tick, queue="roles")
    def tick(args: Tick, ctx: JobContext) -> None:
        with app.lock:
            app.done.append(ctx.job_id)

    return app


def empty_tables(engine: Engine, schema: str) -> None:
    """Empty the jobs, their history and the schedules: each scenario starts with no tick."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f"TRUNCATE {schema}.sqla_jobs_job, {schema}.sqla_jobs_history, "
                f"{schema}.sqla_jobs_schedule"
            )
        )


def schedule_row(engine: Engine, schema: str, name: str = TICK) -> Any:
    """The schedule's row in ``sqla_jobs_schedule``, or None."""
    with engine.connect() as conn:
        return conn.execute(
            text(f"SELECT * FROM {schema}.sqla_jobs_schedule WHERE name = :name"), {"name": name}
        ).one_or_none()


def tick_jobs(engine: Engine, schema: str) -> int:
    """How many jobs in the table a scheduler (or a run now) enqueued for :data:`TICK`."""
    return int(
        count(
            engine,
            f"SELECT count(*) FROM {schema}.sqla_jobs_job WHERE meta->>'schedule' = '{TICK}'",
        )
    )


def run_ticks_as(roles: Roles, engine: Engine, role: str) -> dict[str, Any]:
    """Run a Worker as ``role`` for an application with a one-second schedule until two ticks
    have run and more wait in the table; return figures."""
    app = make_ticking_app(roles.schema)
    empty_tables(engine, roles.schema)
    worker = Worker(app.jobs, roles.url(role), poll_interval=0.1)
    with edge_app.running(worker) as crashes:
        wait_running(crashes, lambda: len(app.done) >= 2, "two ticks run")
        # Ticks are enqueued ahead of their time (run_at = the tick): the next ones are pending,
        # tagged with the schedule in their meta.
        ahead = wait_running(crashes, lambda: tick_jobs(engine, roles.schema), "a tick ahead")
    row = schedule_row(engine, roles.schema)
    assert row is not None
    assert (row.kind, row.paused_at) == (TICK, None)
    assert row.last_tick_at is not None
    assert row.last_job_id is not None
    assert worker.scheduler is not None
    return {
        "role": role,
        "ticks_run": len(app.done),
        "ticks_enqueued": worker.scheduler.enqueued,
        "ticks_ahead": ahead,
    }


@injects("non-superuser roles with the grants of docs/roles.md; a schedule every second")
def test_worker_role_enqueues_and_runs_the_ticks_of_a_schedule(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """A Worker connected as the worker role, for an application that declares a schedule,
    starts its scheduler, which registers the schedule, advances its last tick and enqueues the
    ticks (SELECT, INSERT, UPDATE on sqla_jobs_schedule, INSERT on sqla_jobs_job); the worker
    runs them."""
    figures.record(**run_ticks_as(roles, engine, "worker"))


def start_refused(worker: Worker) -> ConfigurationError:
    """Run ``worker``, which must refuse to start with a ConfigurationError; return it."""
    raised: list[BaseException] = []

    def main() -> None:
        try:
            worker.run_sync(install_signal_handlers=False)
        except BaseException as exc:  # handed to the test's thread below
            raised.append(exc)

    # On a thread, not under pytest.raises: a worker that wrongly starts would run forever.
    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    wait_for(lambda: raised or worker.started.is_set(), "the worker refuses to start, or starts")
    if not raised:
        worker.stop()
        thread.join(edge_app.DEADLINE)
        pytest.fail("the worker started: it did not see that its role may not run the schedules")
    thread.join(edge_app.DEADLINE)
    # The worker leaves its scheduler's pool open when the check refuses it: close it here, or
    # its connection is garbage-collected open (a ResourceWarning, an error in this suite).
    if worker.scheduler is not None:
        worker.scheduler.engine.dispose()
    assert isinstance(raised[0], ConfigurationError), repr(raised[0])
    return raised[0]


#: Page-style statements (localized like the page's blocks) that take from the worker what the
#: scheduler needs, as the page granted it before schedules existed (or as a partial grant).
MISSING_SCHEDULE_GRANTS = {
    "every-schedule-grant": [
        "REVOKE INSERT ON jobs.sqla_jobs_job FROM jobs_worker",
        "REVOKE ALL ON jobs.sqla_jobs_schedule FROM jobs_worker",
    ],
    "insert-on-jobs": ["REVOKE INSERT ON jobs.sqla_jobs_job FROM jobs_worker"],
    "write-on-schedules": ["REVOKE INSERT, UPDATE ON jobs.sqla_jobs_schedule FROM jobs_worker"],
}


@injects("the worker role without the grants of the scheduler (the page's earlier grants)")
@pytest.mark.parametrize(
    "missing",
    [
        "every-schedule-grant",
        "insert-on-jobs",
        "write-on-schedules",
    ],
)
def test_worker_role_without_the_schedule_grants_refuses_to_start_unless_told_not_to_schedule(
    roles: Roles, engine: Engine, doc_sql: dict[str, str], figures: Figures, missing: str
) -> None:
    """A worker role lacking the scheduler's grants, for an application that declares a
    schedule: the Worker stops with a ConfigurationError naming the grants and --no-schedules
    before it claims or writes anything; with schedules=False it runs the jobs and no scheduler."""
    app = make_ticking_app(roles.schema)
    empty_tables(engine, roles.schema)
    with Session(engine) as session:
        job_id = app.jobs.enqueue(session, Greet(n=1)).id
        session.commit()
    run_as(roles.url("owner"), [roles.localize(s) for s in MISSING_SCHEDULE_GRANTS[missing]])
    try:
        error = start_refused(Worker(app.jobs, roles.url("worker"), poll_interval=0.1))
        assert "--no-schedules" in str(error)
        assert "sqla_jobs_schedule" in str(error)
        assert states_of(engine, roles.schema, [job_id]) == ["pending"]
        assert count(engine, f"SELECT attempts FROM {roles.schema}.sqla_jobs_job") == 0
        assert schedule_row(engine, roles.schema) is None

        worker = Worker(app.jobs, roles.url("worker"), poll_interval=0.1, schedules=False)
        with edge_app.running(worker) as crashes:
            wait_running(crashes, lambda: job_id in app.done, "the job runs")
        assert worker.scheduler is None
        assert schedule_row(engine, roles.schema) is None
        assert tick_jobs(engine, roles.schema) == 0
    finally:
        run_as(roles.url("owner"), statements_of(roles.localize(doc_sql[OWNER_BLOCK])))
    figures.record(missing=missing, refused=str(error).split(":")[0])


@injects("non-superuser roles with the grants of docs/roles.md; a schedule declared")
def test_operator_pauses_and_resumes_a_schedule_and_the_reader_cannot(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The operator pauses and resumes a schedule (an upsert into sqla_jobs_schedule); the
    reader lists the schedules but is refused pause and resume. Running a schedule now is an
    enqueue: refused to both, allowed to the operator once granted the enqueuer's role, as
    docs/roles.md says."""
    app = make_ticking_app(roles.schema)
    empty_tables(engine, roles.schema)
    operator = roles.engine("operator")
    reader = roles.engine("reader")
    with Session(operator) as session, session.begin():
        paused_at = app.jobs.pause_schedule(session, TICK)
    row = schedule_row(engine, roles.schema)
    assert row is not None
    assert row.paused_at == paused_at

    with Session(reader) as session:
        [info] = app.jobs.list_schedules(session)
    assert (info.name, info.paused_at, info.next_tick_at) == (TICK, paused_at, None)

    def as_reader(action: Callable[[Session], Any]) -> Callable[[], None]:
        def run() -> None:
            with Session(reader) as session, session.begin():
                action(session)

        return run

    def run_now_as_operator() -> int:
        with Session(operator) as session, session.begin():
            return app.jobs.run_schedule(session, TICK).id

    messages = [
        refused(as_reader(lambda session: app.jobs.resume_schedule(session, TICK))),
        refused(as_reader(lambda session: app.jobs.pause_schedule(session, TICK))),
        refused(as_reader(lambda session: app.jobs.run_schedule(session, TICK))),
        refused(run_now_as_operator),
    ]
    assert all("sqla_jobs_schedule" in m or "sqla_jobs_job" in m for m in messages)
    still = schedule_row(engine, roles.schema)
    assert still is not None
    assert still.paused_at == paused_at

    with Session(operator) as session, session.begin():
        app.jobs.resume_schedule(session, TICK)
        [info] = app.jobs.list_schedules(session)
    assert info.paused_at is None
    assert info.next_tick_at is not None
    resumed = schedule_row(engine, roles.schema)
    assert resumed is not None
    assert resumed.paused_at is None

    operator_role, enqueuer_role = roles.name("operator"), roles.name("enqueuer")
    with engine.begin() as conn:
        conn.execute(text(f"GRANT {enqueuer_role} TO {operator_role}"))
    try:
        job_id = run_now_as_operator()
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"REVOKE {enqueuer_role} FROM {operator_role}"))
    with engine.connect() as conn:
        meta = conn.execute(
            text(f"SELECT meta FROM {roles.schema}.sqla_jobs_job WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    assert (meta["schedule"], meta["manual"]) == (TICK, True)
    operator.dispose()
    reader.dispose()
    figures.record(refused=len(messages))


class Refresh(BaseModel):
    order_id: int
    note: str


def make_unique_app(schema: str) -> App:
    """:func:`make_app` with a unique kind: one ``roles_refresh`` job per order at a time."""
    app = make_app(schema)
    app.jobs.register("roles_refresh", Refresh, queue="roles", unique=Unique(by=("order_id",)))
    return app


@injects("non-superuser roles with the grants of docs/roles.md; a unique kind")
def test_enqueuer_replaces_a_pending_unique_job(
    roles: Roles, engine: Engine, doc_sql: dict[str, str], figures: Figures
) -> None:
    """The enqueuer enqueues a unique kind twice with on_conflict="replace": the second call
    replaces the pending job's payload, priority and meta (UPDATE on those columns, granted by
    the page). Without that column grant, replace is refused even for a new key, and "skip" and
    "raise" still work."""
    app = make_unique_app(roles.schema)
    table = f"{roles.schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {table}"))
    enqueuer = roles.engine("enqueuer")

    def enqueue(
        note: str, on_conflict: OnConflict, order_id: int = 1
    ) -> tuple[int, bool | None, bool]:
        with Session(enqueuer) as session:
            job = app.jobs.enqueue(
                session,
                Refresh(order_id=order_id, note=note),
                delay=3600,
                priority=len(note),
                meta={"note": note},
                on_conflict=on_conflict,
            )
            # Read before the commit expires it: a reload would not be schema-translated.
            outcome = job.id, job.inserted, job.replaced
            session.commit()
            return outcome

    def stored() -> list[tuple[str, int, str]]:
        with engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT payload->>'note', priority, meta->>'note' FROM {table} ORDER BY id")
            )
            return [tuple(r) for r in rows]

    first_id, inserted, _ = enqueue("first", "replace")
    assert inserted is True
    second = enqueue("second version", "replace")
    assert second == (first_id, False, True)
    assert stored() == [("second version", len("second version"), "second version")]

    revoke = (
        "REVOKE UPDATE (payload, priority, run_at, meta) ON jobs.sqla_jobs_job FROM jobs_enqueuer"
    )
    run_as(roles.url("owner"), [roles.localize(revoke)])
    try:
        # PostgreSQL checks the DO UPDATE's columns when it plans the statement: a key nobody
        # holds is refused too.
        message = refused(lambda: enqueue("third", "replace", order_id=2))
        assert enqueue("third", "skip") == (first_id, False, False)
        with pytest.raises(DuplicateJobError):
            enqueue("third", "raise")
    finally:
        run_as(roles.url("owner"), statements_of(roles.localize(doc_sql[OWNER_BLOCK])))
    assert stored() == [("second version", len("second version"), "second version")]
    enqueuer.dispose()
    figures.record(replaced=second[0], refused=message)


# -- handlers that take a Session ----------------------------------------------------------------

#: The first lines of the page's blocks for the role of handlers' Sessions.
HANDLER_BLOCK = "-- handler sessions: as jobs_owner"
HISTORY_BLOCK = "-- handler sessions, workers with --keep-history"
FOREIGN_KEY_BLOCK = "-- handler sessions, a table of yours with a foreign key"


def block(doc_sql: dict[str, str], first: str) -> str:
    """The one block of the page whose first line starts with ``first``."""
    found = [b for line, b in doc_sql.items() if line.startswith(first)]
    assert len(found) == 1, f"docs/roles.md has one block starting {first!r}"
    return found[0]


@dataclass
class AppUser:
    """The application's own role (the page's ``app_user``) and its tables: a counter per job
    (and the role that last wrote it), and notes pointing at jobs (created when a test needs a
    foreign key to the job table)."""

    name: str
    url: str
    counter: str
    note: str


@pytest.fixture(scope="module")
def app_user(roles: Roles, engine: Engine) -> Iterator[AppUser]:
    """The application's role, with its counter table and none of the page's grants on the job
    tables; dropped afterwards."""
    user = AppUser(
        name=roles.app_user,
        url=roles.url_of(roles.app_user),
        counter=f"roles_counter_{roles.suffix}",
        note=f"roles_note_{roles.suffix}",
    )
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {user.name} LOGIN PASSWORD '{roles.password}'"))
        conn.execute(
            text(
                f"CREATE TABLE {user.counter} "
                "(id int PRIMARY KEY, n int NOT NULL DEFAULT 0, written_by text)"
            )
        )
        conn.execute(text(f"GRANT SELECT, UPDATE ON {user.counter} TO {user.name}"))
    try:
        yield user
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {user.note}, {user.counter}"))
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :u"),
                {"u": user.name},
            )
            conn.execute(text(f"DROP OWNED BY {user.name}"))
            conn.execute(text(f"DROP ROLE {user.name}"))


class Count(BaseModel):
    counter: int
    #: Also write a note pointing at the job (a foreign key to the job table).
    note: bool = False


class CountAsync(Count):
    pass


def make_session_app(schema: str, user: AppUser) -> Jobs:
    """Kinds whose handlers take a Session (sync and async): each adds one to its counter as the
    Session's role, and may write a note pointing at its own job."""
    jobs = Jobs(schema=schema)
    bump = f"UPDATE {user.counter} SET n = n + 1, written_by = current_user WHERE id = :id"
    note = f"INSERT INTO {user.note} (job_id) VALUES (:id)"

    @jobs.kind("roles_count", Count, queue="roles", max_attempts=3)
    def count_sync(args: Count, ctx: JobContext, session: Session) -> None:
        session.execute(text(bump), {"id": args.counter})
        if args.note:
            session.execute(text(note), {"id": ctx.job_id})

    @jobs.kind("roles_count_async", CountAsync, queue="roles", max_attempts=3)
    async def count_async(args: CountAsync, ctx: JobContext, session: AsyncSession) -> None:
        await session.execute(text(bump), {"id": args.counter})
        if args.note:
            await session.execute(text(note), {"id": ctx.job_id})

    return jobs


def grant_handler_blocks(roles: Roles, doc_sql: dict[str, str], *firsts: str) -> None:
    for first in firsts:
        run_as(roles.url("owner"), statements_of(roles.localize(block(doc_sql, first))))


def revoke_handler_grants(roles: Roles, user: AppUser) -> None:
    """Take from the application's role every privilege on the job tables and their schema
    (revoking a table's privileges revokes its columns' too)."""
    run_as(
        roles.url("owner"),
        [
            f"REVOKE ALL ON ALL TABLES IN SCHEMA {roles.schema} FROM {user.name}",
            f"REVOKE USAGE ON SCHEMA {roles.schema} FROM {user.name}",
        ],
    )


def start_counting(engine: Engine, roles: Roles, user: AppUser, payload: Count) -> int:
    """Counter ``payload.counter`` at zero, the job tables empty; enqueue ``payload``."""
    with engine.begin() as conn:
        conn.execute(
            text(f"TRUNCATE {roles.schema}.sqla_jobs_job, {roles.schema}.sqla_jobs_history")
        )
        conn.execute(text(f"DELETE FROM {user.counter}"))
        conn.execute(text(f"INSERT INTO {user.counter} (id) VALUES (:id)"), {"id": payload.counter})
    with Session(engine) as session, session.begin():
        return make_session_app(roles.schema, user).enqueue(session, payload).id


def counter_row(engine: Engine, user: AppUser, counter: int) -> tuple[int, str | None]:
    with engine.connect() as conn:
        n, by = conn.execute(
            text(f"SELECT n, written_by FROM {user.counter} WHERE id = :id"), {"id": counter}
        ).one()
    return int(n), by


def job_row(engine: Engine, schema: str, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(f"SELECT state, attempts, last_error FROM {schema}.sqla_jobs_job WHERE id = :id"),
            {"id": job_id},
        ).one_or_none()


@contextlib.contextmanager
def app_session_worker(
    roles: Roles, user: AppUser, flavour: str, *, keep_history: bool
) -> Iterator[tuple[Worker, list[BaseException]]]:
    """A Worker connected as the worker role whose handlers' Sessions come from a sessionmaker
    (``flavour`` "sync") or an async_sessionmaker ("async") on the application's role."""
    jobs = make_session_app(roles.schema, user)
    maker: sessionmaker[Session] | async_sessionmaker[AsyncSession]
    if flavour == "sync":
        sync_engine = create_engine(user.url, poolclass=NullPool)
        maker = sessionmaker(sync_engine)
    else:
        async_engine = create_async_engine(user.url, poolclass=NullPool)
        maker = async_sessionmaker(async_engine)
    worker = Worker(
        jobs, roles.url("worker"), poll_interval=0.1, keep_history=keep_history, sessionmaker=maker
    )
    try:
        with edge_app.running(worker) as crashes:
            yield worker, crashes
    finally:
        if flavour == "sync":
            sync_engine.dispose()
        else:
            asyncio.run(async_engine.dispose())


def payload_of(flavour: str, **fields: Any) -> Count:
    return (Count if flavour == "sync" else CountAsync)(counter=1, **fields)


@injects("a handler's Session on the application's role, with the page's grants for it")
@pytest.mark.parametrize(("flavour", "keep_history"), [("sync", True), ("async", False)])
def test_handler_session_on_the_application_role_completes_its_job_with_the_page_s_grants(
    roles: Roles,
    engine: Engine,
    doc_sql: dict[str, str],
    app_user: AppUser,
    figures: Figures,
    flavour: str,
    keep_history: bool,
) -> None:
    """A Worker connected as the worker role, whose handlers' Sessions come from the
    application's sessionmaker on the application's role, granted the page's block for handler
    sessions (and the history's, with keep_history) and nothing more on the job tables: the
    handler writes as the application's role, and its write and its job's completion (the copy
    into history) commit in one transaction."""
    job_id = start_counting(engine, roles, app_user, payload_of(flavour))
    revoke_handler_grants(roles, app_user)
    blocks = (HANDLER_BLOCK, HISTORY_BLOCK) if keep_history else (HANDLER_BLOCK,)
    grant_handler_blocks(roles, doc_sql, *blocks)
    try:
        with app_session_worker(roles, app_user, flavour, keep_history=keep_history) as (
            worker,
            crashes,
        ):
            wait_running(crashes, lambda: worker.counts["done"] == 1, "the job done")
    finally:
        revoke_handler_grants(roles, app_user)
    assert counter_row(engine, app_user, 1) == (1, app_user.name)
    assert job_row(engine, roles.schema, job_id) is None
    if keep_history:
        with engine.connect() as conn:
            # One transaction: the counter's new row version and the history row were written by
            # the same transaction id.
            same = conn.execute(
                text(
                    f"SELECT (SELECT xmin::text FROM {app_user.counter} WHERE id = 1) = "
                    f"(SELECT xmin::text FROM {roles.schema}.sqla_jobs_history WHERE id = :id)"
                ),
                {"id": job_id},
            ).scalar_one()
        assert same is True
    figures.record(flavour=flavour, keep_history=keep_history, done=worker.counts["done"])


@dataclass(frozen=True)
class Missing:
    """A grant of the page taken away: the page's blocks granted first, the page-style statements
    (localized like its blocks) that take it back, what the refusal names, and the setup."""

    blocks: tuple[str, ...]
    revoke: tuple[str, ...]
    names: str
    keep_history: bool = False
    foreign_key: bool = False


#: Grants the worker checks for before it starts: without one, it refuses to start.
REFUSED_HANDLER_GRANTS = {
    "delete-on-jobs": Missing(
        (HANDLER_BLOCK,), ("REVOKE DELETE ON jobs.sqla_jobs_job FROM app_user",), "sqla_jobs_job"
    ),
    "select-on-jobs": Missing(
        (HANDLER_BLOCK,), ("REVOKE SELECT ON jobs.sqla_jobs_job FROM app_user",), "sqla_jobs_job"
    ),
    "usage-on-the-schema": Missing(
        (HANDLER_BLOCK,), ("REVOKE USAGE ON SCHEMA jobs FROM app_user",), "schema jobs"
    ),
    "insert-on-history": Missing(
        (HANDLER_BLOCK, HISTORY_BLOCK),
        ("REVOKE INSERT ON jobs.sqla_jobs_history FROM app_user",),
        "sqla_jobs_history",
        keep_history=True,
    ),
}

#: Grants only a completion finds missing: the attempt fails and its retry completes.
MISSING_HANDLER_GRANTS = {
    "select-on-history": Missing(
        (HANDLER_BLOCK, HISTORY_BLOCK),
        ("REVOKE SELECT (id) ON jobs.sqla_jobs_history FROM app_user",),
        "sqla_jobs_history",
        keep_history=True,
    ),
    "update-for-a-foreign-key": Missing(
        (HANDLER_BLOCK, FOREIGN_KEY_BLOCK),
        ("REVOKE UPDATE ON jobs.sqla_jobs_job FROM app_user",),
        "sqla_jobs_job",
        foreign_key=True,
    ),
}


@injects("a handler's Session on the application's role lacking a grant the worker checks")
@pytest.mark.parametrize("missing", list(REFUSED_HANDLER_GRANTS))
def test_handler_session_without_a_checked_grant_refuses_to_start(
    roles: Roles,
    engine: Engine,
    doc_sql: dict[str, str],
    app_user: AppUser,
    figures: Figures,
    missing: str,
) -> None:
    """The application's role lacking USAGE on the schema, SELECT or DELETE on the job table,
    or (with history) INSERT on the history table: the worker refuses to start, naming the
    grants and docs/roles.md, before it claims anything; the job waits, untouched."""
    case = REFUSED_HANDLER_GRANTS[missing]
    job_id = start_counting(engine, roles, app_user, Count(counter=1))
    revoke_handler_grants(roles, app_user)
    jobs = make_session_app(roles.schema, app_user)
    sync_engine = create_engine(app_user.url, poolclass=NullPool)
    try:
        grant_handler_blocks(roles, doc_sql, *case.blocks)
        run_as(roles.url("owner"), [roles.localize(s) for s in case.revoke])
        worker = Worker(
            jobs,
            roles.url("worker"),
            poll_interval=0.1,
            keep_history=case.keep_history,
            sessionmaker=sessionmaker(sync_engine),
        )
        error = str(start_refused(worker))
        assert "docs/roles.md" in error
        assert "DELETE on sqla_jobs_job" in error
        assert job_row(engine, roles.schema, job_id)[:2] == ("pending", 0)
        assert counter_row(engine, app_user, 1) == (0, None)
    finally:
        sync_engine.dispose()
        revoke_handler_grants(roles, app_user)
    figures.record(missing=missing, refused=error.split(":")[0][:160])


@injects("a handler's Session on the application's role, one grant of the page taken away")
@pytest.mark.parametrize("missing", list(MISSING_HANDLER_GRANTS))
def test_handler_session_without_a_grant_of_the_page_fails_the_attempt_and_retries_the_job(
    roles: Roles,
    engine: Engine,
    doc_sql: dict[str, str],
    app_user: AppUser,
    figures: Figures,
    caplog: pytest.LogCaptureFixture,
    missing: str,
) -> None:
    """The application's role lacking a grant the start cannot check (a column's SELECT on the
    history table, the UPDATE that keeps a job a foreign key holds): the completion is refused
    inside the handler's transaction, so the handler's write
    rolls back with it; the attempt fails with the refusal, naming the table, in last_error and
    the worker's log, and the job waits for its retry, which completes it (kept ``completed``
    where a foreign key of the application's points at it) once the grant is back."""
    case = MISSING_HANDLER_GRANTS[missing]
    schema = roles.schema
    job_id = start_counting(engine, roles, app_user, Count(counter=1, note=case.foreign_key))
    revoke_handler_grants(roles, app_user)
    if case.foreign_key:
        with engine.begin() as conn:
            # A NO ACTION key to the job, present before the worker starts (it looks for them
            # once): its completion's DELETE then runs in a savepoint, and refused, the job is
            # kept completed by an UPDATE.
            conn.execute(
                text(
                    f"CREATE TABLE {app_user.note} "
                    f"(job_id bigint NOT NULL REFERENCES {schema}.sqla_jobs_job (id))"
                )
            )
            conn.execute(text(f"GRANT INSERT ON {app_user.note} TO {app_user.name}"))
    try:
        grant_handler_blocks(roles, doc_sql, *case.blocks)
        run_as(roles.url("owner"), [roles.localize(s) for s in case.revoke])
        with (
            caplog.at_level(logging.WARNING, "sqla_jobs"),
            app_session_worker(roles, app_user, "sync", keep_history=case.keep_history) as (
                worker,
                crashes,
            ),
        ):
            # The worker counts the failure, then logs it: wait for the line too.
            wait_running(
                crashes,
                lambda: worker.counts["failed"] == 1 and "failed attempt 1" in caplog.text,
                "the attempt failed and was logged",
            )
            state, attempts, error = job_row(engine, schema, job_id)
            assert (state, attempts) == ("pending", 1)
            assert "permission denied" in error
            assert roles.localize(case.names) in error
            assert f"permission denied for {'schema' if 'schema' in case.names else 'table'}" in (
                caplog.text
            )
            assert counter_row(engine, app_user, 1) == (0, None), "the write was not rolled back"
            grant_handler_blocks(roles, doc_sql, *case.blocks)
            with engine.begin() as conn:
                conn.execute(
                    text(f"UPDATE {schema}.sqla_jobs_job SET run_at = now() WHERE id = :id"),
                    {"id": job_id},
                )
            wait_running(crashes, lambda: worker.counts["done"] == 1, "the retry done")
        assert counter_row(engine, app_user, 1) == (1, app_user.name)
        kept = job_row(engine, schema, job_id)
        if case.foreign_key:
            assert kept[:2] == ("completed", 2)
        else:
            assert kept is None
        if case.keep_history:
            history = count(
                engine, f"SELECT attempts FROM {schema}.sqla_jobs_history WHERE id = {job_id}"
            )
            assert history == 2
    finally:
        revoke_handler_grants(roles, app_user)
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {app_user.note}"))
    figures.record(missing=missing, refused=error.split("\n")[0][:160])


@injects("a handler's Session with no sessionmaker: on the worker's URL, as the worker role")
def test_handler_session_without_a_sessionmaker_is_the_worker_role(
    roles: Roles, engine: Engine, app_user: AppUser, figures: Figures
) -> None:
    """Without a sessionmaker the handler's Session is made on the worker's URL: it writes as
    the worker role, which needs the application's table and nothing more than its own grants."""
    job_id = start_counting(engine, roles, app_user, Count(counter=1))
    revoke_handler_grants(roles, app_user)
    worker_role = roles.name("worker")
    with engine.begin() as conn:
        conn.execute(text(f"GRANT SELECT, UPDATE ON {app_user.counter} TO {worker_role}"))
    try:
        worker = Worker(
            make_session_app(roles.schema, app_user), roles.url("worker"), poll_interval=0.1
        )
        with edge_app.running(worker) as crashes:
            wait_running(crashes, lambda: worker.counts["done"] == 1, "the job done")
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"REVOKE ALL ON {app_user.counter} FROM {worker_role}"))
    assert counter_row(engine, app_user, 1) == (1, worker_role)
    assert job_row(engine, roles.schema, job_id) is None
    figures.record(done=worker.counts["done"])


@injects("non-superuser roles with the grants of docs/roles.md")
def test_job_dependencies_run_with_the_documented_grants(
    roles: Roles, engine: Engine, figures: Figures
) -> None:
    """The enqueuer enqueues a chain and a second parent with a child, the worker role runs the
    chain (its completion releases the child through the dependency triggers), and the operator's
    cancel of the other parent cancels its child: no role needs a grant on what the triggers
    write."""
    app = make_app(roles.schema)
    table = f"{roles.schema}.sqla_jobs_job"
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {table} SET state = 'cancelled', finished_at = now()"))
        conn.execute(text(f"TRUNCATE {table}, {roles.schema}.sqla_jobs_history"))
    enqueuer = roles.engine("enqueuer")
    with Session(enqueuer) as session, session.begin():
        first = app.jobs.enqueue(session, Greet(n=1))
        second = app.jobs.enqueue(session, Greet(n=2), depends_on=[first])
        other = app.jobs.enqueue(session, Greet(n=3))
        orphan = app.jobs.enqueue(session, Greet(n=4), depends_on=[other])
        session.flush()
        ids = (first.id, second.id, other.id, orphan.id)
    # Edges on a job another transaction enqueued would hold, release or cancel it through the
    # triggers' rights: refused.
    edges = f"{roles.schema}.sqla_jobs_dependency"
    message = refused(
        execute_as(enqueuer, f"INSERT INTO {edges} VALUES ({ids[2]}, {ids[0]}, false)")
    )
    assert "was not enqueued by this transaction" in message
    enqueuer.dispose()

    def state(job_id: int) -> str | None:
        with engine.connect() as conn:
            found = conn.execute(
                text(f"SELECT state FROM {table} WHERE id = :id"), {"id": job_id}
            ).scalar()
        return None if found is None else str(found)

    assert [state(i) for i in ids] == ["pending", "waiting", "pending", "waiting"]
    operator = roles.engine("operator")
    with Session(operator) as session, session.begin():
        app.jobs.cancel(session, [ids[2]])
    operator.dispose()
    assert (state(ids[2]), state(ids[3])) == ("cancelled", "cancelled")
    worker = Worker(app.jobs, roles.url("worker"), poll_interval=0.1, queues=["roles"])
    with edge_app.running(worker):
        wait_for(lambda: len(app.done) == 2, "the chain's two jobs are done")
    assert app.done == [ids[0], ids[1]], "the child ran after its parent"
    wait_for(lambda: state(ids[1]) is None, "the child's completion written")
    connector = Connector(libpq_conninfo(roles.url("worker")), "roles-pruner")
    pruner = Pruner(connector=connector, schema=roles.schema, retention=Retention(), interval=60)
    try:  # the chain's edge goes (its child is gone); the cancelled child's stays with it
        assert pruner._prune_side(pruner._connection(), EDGES, "edges", "dependency") == 1
    finally:
        pruner._close()
    figures.record(chain=2, cancelled_with_parent=1)


@injects("non-superuser roles with the grants of docs/roles.md, a rate limited kind")
def test_worker_role_runs_rate_limited_jobs_and_prunes_their_idle_limiters(
    roles: Roles, engine: Engine
) -> None:
    """With the page's grants on ``sqla_jobs_rate_limiter``, the worker role creates, locks and
    writes a limiter per key as it claims, and its pruner deletes them once idle."""
    jobs = Jobs(schema=roles.schema)
    done: list[int] = []
    limit = RateLimit(5, per=timedelta(milliseconds=100), by=lambda p: f"k{p.n}")
    jobs.register("roles_limited", Greet, lambda p, ctx: done.append(p.n), rate_limit=limit)
    limiters = f"{roles.schema}.sqla_jobs_rate_limiter"
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {roles.schema}.sqla_jobs_job, {limiters}"))
    with Session(engine) as session:
        jobs.enqueue_many(session, [Greet(n=i) for i in range(3)])
        session.commit()
    with edge_app.running(Worker(jobs, roles.url("worker"), poll_interval=0.1)):
        wait_for(lambda: len(done) == 3, "the rate limited jobs run")
    assert count(engine, f"SELECT count(*) FROM {limiters}") == 3
    idle = f"SELECT count(*) FROM {limiters} WHERE free_at < clock_timestamp()"
    wait_for(lambda: count(engine, idle) == 3, "the limiters' windows pass")
    connector = Connector(libpq_conninfo(roles.url("worker")), "roles")
    pruner = Pruner(connector=connector, schema=roles.schema, retention=Retention(), interval=60)
    try:
        # The limiters' part of a pruner's run, on the worker role's connection.
        pruned = pruner._prune_side(
            pruner._connection(), RATE_LIMITERS, "idle rate limiters", "sqla_jobs_rate_limiter"
        )
        assert pruned == 3
    finally:
        pruner._close()
    assert count(engine, f"SELECT count(*) FROM {limiters}") == 0
