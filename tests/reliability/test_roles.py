"""Least privilege: the roles and grants of docs/roles.md, run as written, on a real PostgreSQL.

The SQL blocks of the page are executed with the role and schema names replaced by unique ones for
this run (roles are cluster-wide), then each role does its job and is refused what it must not do:
the owner migrates without superuser, the enqueuer adds jobs but cannot change them, the worker runs
them (skipping paused queues) but cannot change the schema, the operator retries, cancels and
pauses but cannot enqueue, the reader runs ``sqla-jobs stats`` but cannot write. The roles
and the schema are dropped at the end.
"""

from __future__ import annotations

import asyncio
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
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import JobContext, Jobs, Worker, stats, testing
from sqla_jobs._db import libpq_conninfo, sqlalchemy_url
from sqla_jobs.enqueue import CHUNK, COPY_THRESHOLD
from sqla_jobs.migrate import upgrade
from tests.reliability import edge_app
from tests.reliability.conftest import Figures, injects
from tests.reliability.edge_app import wait_for

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
        return sql.replace("'change-me'", f"'{self.password}'")

    def url(self, role: str) -> str:
        """A URL of the test database that logs in as ``role``."""
        return (
            make_url(sqlalchemy_url(self.server_url))
            .set(username=self.name(role), password=self.password)
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
        ("alembic_version", "sqla_jobs_history", "sqla_jobs_job", "sqla_jobs_queue"),
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
    sync and async), and is refused UPDATE, DELETE, TRUNCATE and the claim: it cannot change a
    job's state."""
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
        refused(execute_as(enqueuer, f"UPDATE {table} SET run_at = now() + interval '1 day'")),
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
    CREATE INDEX) and INSERT of new jobs."""
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
        refused(execute_as(worker, f"INSERT INTO {table} (kind, payload) VALUES ('x', '{{}}')")),
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

    with edge_app.running(worker):
        wait_for(wobbly_failed, "the failure is recorded")
        with engine.begin() as conn:
            conn.execute(
                text(f"UPDATE {table} SET run_at = now() WHERE id = :id"), {"id": wobbly_id}
            )
        wait_for(lambda: len(app.done) == 5, "every job is done")
        wait_for(lambda: count(engine, f"SELECT count(*) FROM {table}") == 0, "all written")
    assert worker.reaper is not None
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
    still runs every statement, and is refused changing a job's payload."""
    strict = [b for first, b in doc_sql.items() if first.startswith(STRICT_BLOCK)]
    assert len(strict) == 1
    run_as(roles.url("owner"), statements_of(roles.localize(strict[0])))
    try:
        figures.record(**run_worker_as(roles, engine, "worker"))
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

    reader = roles.engine("reader")
    messages = [
        refused(execute_as(reader, f"INSERT INTO {table} (kind, payload) VALUES ('x', '{{}}')")),
        refused(execute_as(reader, f"UPDATE {table} SET state = 'dead'")),
        refused(execute_as(reader, f"DELETE FROM {table}")),
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
            text(f"TRUNCATE {table}, {schema}.sqla_jobs_history, {schema}.sqla_jobs_queue")
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
    ]
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
    """The reader (a read-only dashboard) reads the jobs, the history and the paused queues, and
    is refused retry and cancel."""
    app = make_app(roles.schema)
    dead, pending = dead_and_pending(engine, app, roles.schema)
    reader = roles.engine("reader")
    for table in ("sqla_jobs_job", "sqla_jobs_history", "sqla_jobs_queue"):
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
