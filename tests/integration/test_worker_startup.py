"""The worker's start-up on a server that takes writes: a check that meets a lost connection (a
failover under way) is undone and run again; the same check losing its connection twice in a row
while a primary answers is no failover, and raises."""

from __future__ import annotations

import asyncio

import pytest
from psycopg import errors

from sqla_jobs.db.connections import AsyncConn, Connector
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.worker.startup import Startup
from sqla_jobs.worker.wakeups import Wakeups

KILLED = errors.AdminShutdown("terminating connection due to administrator command")


class Checks:
    """Start-up checks that meet a lost connection on their first ``failures`` runs."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0
        self.undone = 0

    async def run(self, conn: AsyncConn) -> None:
        # The connection that found the primary is the checks' to keep or close.
        await conn.close()
        self.runs += 1
        if self.runs <= self.failures:
            raise KILLED

    async def undo(self) -> None:
        self.undone += 1


def start(url: str, checks: Checks) -> bool:
    async def main() -> bool:
        connector = Connector(libpq_conninfo(url), "startup-test")
        startup = Startup(connector, Wakeups(asyncio.get_running_loop()))
        return await startup.run(checks.run, checks.undo)

    return asyncio.run(main())


def test_a_check_that_meets_a_lost_connection_is_undone_and_run_again(migrated_url: str) -> None:
    checks = Checks(failures=1)
    assert start(migrated_url, checks) is True
    assert (checks.runs, checks.undone) == (2, 1)


def test_a_check_lost_twice_in_a_row_while_a_primary_answers_raises(migrated_url: str) -> None:
    checks = Checks(failures=2)
    with pytest.raises(errors.AdminShutdown):
        start(migrated_url, checks)
    assert (checks.runs, checks.undone) == (2, 1)


def test_an_error_that_is_not_a_lost_connection_raises_at_once(migrated_url: str) -> None:
    async def refused(conn: AsyncConn) -> None:
        await conn.close()
        raise errors.InsufficientPrivilege("permission denied for table sqla_jobs_job")

    checks = Checks(failures=0)
    checks.run = refused  # type: ignore[method-assign]
    with pytest.raises(errors.InsufficientPrivilege):
        start(migrated_url, checks)
    assert checks.undone == 0
