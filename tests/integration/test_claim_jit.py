"""The keyed claim runs with JIT compilation off, and only it; the transaction it runs in
(``sqla_jobs.worker.claim_txn``) on its own.

Its recursive scans are estimated above ``jit_above_cost`` on a large backlog: with JIT on, a
200,000-job keyed backlog drained at a third of the speed (bench/README.md). A trigger records
the ``jit`` setting in force in each claiming transaction, as the claim's UPDATE runs; the database
has ``jit = on`` for the test, whatever the server's default.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, RateLimit
from sqla_jobs.db.connections import should_reconnect
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.worker.claim_txn import claim_transaction

from ._workers import queue_empty, running_workers, wait_until

_CREATE = """
CREATE TABLE IF NOT EXISTS test_claim_jit (kind text, jit text);
TRUNCATE test_claim_jit;
CREATE OR REPLACE FUNCTION test_record_claim_jit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_claim_jit VALUES (NEW.kind, current_setting('jit'));
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS test_record_claim_jit ON sqla_jobs_job;
CREATE TRIGGER test_record_claim_jit AFTER UPDATE OF state ON sqla_jobs_job FOR EACH ROW
    WHEN (OLD.state = 'pending' AND NEW.state = 'running')
    EXECUTE FUNCTION test_record_claim_jit();
"""


class Keyed(BaseModel):
    n: int


class Rated(BaseModel):
    n: int


class Plain(BaseModel):
    n: int


@pytest.fixture
def recorded(clean: Engine) -> Iterator[Engine]:
    """Each claim's kind and ``jit`` setting in ``test_claim_jit``; ``jit = on`` for new sessions."""
    with clean.connect() as conn:
        database = conn.execute(text("SELECT current_database()")).scalar_one()
    alter = f'ALTER DATABASE "{database}"'
    with clean.begin() as conn:
        conn.execute(text(_CREATE))
        conn.execute(text(f"{alter} SET jit = on"))
    try:
        yield clean
    finally:
        with clean.begin() as conn:
            conn.execute(text("DROP TRIGGER IF EXISTS test_record_claim_jit ON sqla_jobs_job"))
            conn.execute(text(f"{alter} RESET jit"))


def _jobs() -> Jobs:
    jobs = Jobs()

    @jobs.kind("keyed", Keyed, concurrency_key=lambda p: f"k{p.n % 3}", concurrency_limit=2)
    def keyed(p: Keyed, ctx: JobContext) -> None:
        pass

    @jobs.kind("rated", Rated, rate_limit=RateLimit(1_000, per=timedelta(seconds=1)))
    def rated(p: Rated, ctx: JobContext) -> None:
        pass

    @jobs.kind("plain", Plain)
    def plain(p: Plain, ctx: JobContext) -> None:
        pass

    return jobs


def test_the_keyed_claim_runs_without_jit_and_leaves_it_to_the_rest(
    recorded: Engine, migrated_url: str
) -> None:
    jobs = _jobs()
    with Session(recorded) as s, s.begin():
        for payload in (Keyed, Rated, Plain):
            jobs.enqueue_many(s, [payload(n=i) for i in range(12)])
    with running_workers(jobs, migrated_url, concurrency=4, poll_interval=0.2):
        wait_until(queue_empty(recorded), 60, "every job to run")
    with recorded.connect() as conn:
        rows = conn.execute(text("SELECT kind, jit FROM test_claim_jit")).all()
    settings: dict[str, set[str]] = {}
    for kind, jit in rows:
        settings.setdefault(kind, set()).add(jit)
    # The unkeyed and the rate limited claims, on the same connections, see the database's
    # setting: JIT off lasted only for the keyed claim's transactions.
    assert settings == {"keyed": {"off"}, "rated": {"on"}, "plain": {"on"}}
    assert len(rows) == 36


async def _connect(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(libpq_conninfo(url), autocommit=True)


def test_the_claim_transaction_commits_at_the_end_and_holds_jit_off_until_then(
    recorded: Engine, migrated_url: str
) -> None:
    async def run() -> tuple[str, str, int]:
        conn = await _connect(migrated_url)
        async with conn:
            async with claim_transaction(conn):
                inside = await (await conn.execute("SHOW jit")).fetchone()
                await conn.execute("INSERT INTO test_claim_jit VALUES ('txn', 'probe')")
            after = await (await conn.execute("SHOW jit")).fetchone()
            assert inside is not None
            assert after is not None
            return str(inside[0]), str(after[0]), int(conn.info.transaction_status)

    inside, after, status = asyncio.run(run())
    assert (inside, after) == ("off", "on")
    assert status == psycopg.pq.TransactionStatus.IDLE
    with recorded.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM test_claim_jit")).scalar_one() == 1


async def _insert_then_divide(conn: psycopg.AsyncConnection[Any]) -> None:
    async with claim_transaction(conn):
        await conn.execute("INSERT INTO test_claim_jit VALUES ('txn', 'probe')")
        await conn.execute("SELECT 1 / 0")


def test_a_failed_statement_rolls_the_claim_transaction_back_and_raises_its_own_error(
    recorded: Engine, migrated_url: str
) -> None:
    async def run() -> tuple[int, str]:
        conn = await _connect(migrated_url)
        async with conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await _insert_then_divide(conn)
            # The connection is usable at once: not left in the failed transaction.
            row = await (await conn.execute("SHOW jit")).fetchone()
            assert row is not None
            return int(conn.info.transaction_status), str(row[0])

    status, jit = asyncio.run(run())
    assert status == psycopg.pq.TransactionStatus.IDLE
    assert jit == "on"
    with recorded.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM test_claim_jit")).scalar_one() == 0


async def _lose_the_connection_inside(conn: psycopg.AsyncConnection[Any], engine: Engine) -> None:
    async with claim_transaction(conn):
        with engine.connect() as other:
            pid = conn.info.backend_pid
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await conn.execute("SELECT 1")


def test_a_connection_lost_inside_the_claim_transaction_raises_the_loss_not_the_rollback(
    recorded: Engine, migrated_url: str
) -> None:
    async def run() -> None:
        conn = await _connect(migrated_url)
        async with conn:
            # The block's error (the server's), not the ROLLBACK's "the connection is closed".
            with pytest.raises(psycopg.errors.AdminShutdown) as raised:
                await _lose_the_connection_inside(conn, recorded)
            assert should_reconnect(raised.value)
            assert conn.closed

    asyncio.run(run())
