"""psycopg's "error ignored terminating" warning, for a pipeline whose connection was lost inside
its block, is left out while a worker runs: in a failover a claim lane met it and the worker
logged one line more than its outage is allowed (CI, test_async_replication_counts_what_it_loses).
Every other psycopg record passes.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from sqlalchemy import Engine

from sqla_jobs import Jobs
from sqla_jobs.db.driver_logs import MESSAGE, LostConnectionEnds, quiet_lost_connection_ends
from sqla_jobs.db.urls import libpq_conninfo
from tests._waiting import DEADLINE, wait_until
from tests.integration._workers import running_workers


def lose_a_pipeline(url: str) -> None:
    """A real pipeline whose server session is ended inside its block: the block raises, and
    ending the pipeline fails too, which psycopg logs on its ``psycopg`` logger."""
    conninfo = libpq_conninfo(url)

    async def scenario() -> None:
        killer = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        try:
            pid = conn.info.backend_pid

            async def gone() -> bool:
                cur = await killer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 0

            async def select_in_a_pipeline() -> None:
                async with conn.pipeline():
                    cur = await conn.execute("SELECT 1")
                    await cur.fetchall()

            # Ended before the pipeline starts: the connection learns of it inside the block.
            await killer.execute("SELECT pg_terminate_backend(%s)", [pid])
            deadline = asyncio.get_running_loop().time() + DEADLINE
            while not await gone():
                assert asyncio.get_running_loop().time() < deadline, "backend not gone"
                await asyncio.sleep(0.01)
            with pytest.raises(psycopg.OperationalError):
                await select_in_a_pipeline()
        finally:
            await conn.close()
            await killer.close()

    asyncio.run(scenario())


def terminating_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "psycopg" and r.getMessage().startswith("error ignored terminating")
    ]


def test_psycopg_warns_when_a_pipeline_loses_its_connection(
    migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What the worker leaves out, without a worker: the scenario below is real."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    lose_a_pipeline(migrated_url)
    [record] = terminating_warnings(caplog)
    assert "the connection is lost" in record.getMessage() or "closed" in record.getMessage()


def test_a_running_worker_leaves_out_psycopgs_warning_for_a_lost_pipeline(
    migrated_url: str, clean: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="psycopg")
    with running_workers(Jobs(), migrated_url, queues=["default"]):
        lose_a_pipeline(migrated_url)
        assert terminating_warnings(caplog) == []
    # Once the worker has stopped, the process's psycopg logs are its own again.
    wait_until(lambda: not logging.getLogger("psycopg").filters, "the filter removed")
    lose_a_pipeline(migrated_url)
    assert len(terminating_warnings(caplog)) == 1


def test_the_filter_passes_every_other_psycopg_record() -> None:
    keep = LostConnectionEnds()

    def record(msg: str, args: tuple[object, ...]) -> logging.LogRecord:
        return logging.LogRecord("psycopg", logging.WARNING, __file__, 1, msg, args, None)

    lost = psycopg.OperationalError("the connection is lost")
    assert not keep.filter(record(MESSAGE, ("<AsyncPipeline [BAD]>", lost)))
    # The same message for an error that leaves the connection usable: said.
    refused = psycopg.errors.UniqueViolation("duplicate key value")
    assert keep.filter(record(MESSAGE, ("<AsyncPipeline [BAD]>", refused)))
    # Any other message of psycopg's: said.
    assert keep.filter(record("error ignored in rollback on %s: %s", ("<conn>", lost)))
    assert keep.filter(record("plain %s", ("text",)))


def test_nested_and_concurrent_workers_share_one_filter() -> None:
    logger = logging.getLogger("psycopg")
    before = list(logger.filters)
    with quiet_lost_connection_ends():
        with quiet_lost_connection_ends():
            assert len(logger.filters) == len(before) + 1
        assert len(logger.filters) == len(before) + 1
    assert logger.filters == before
