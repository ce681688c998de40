"""The worker's long-lived connections are named and keep TCP keepalives on."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, text

from sqla_jobs import JobContext, Jobs
from sqla_jobs._connections import AsyncConn, Conn, Connector
from sqla_jobs.testing import WorkerSeams

from ._workers import running_workers, wait_until


class Ping(BaseModel):
    n: int = 0


class RecordingConnector(Connector):
    """Opens connections as the worker's own connector does, and keeps each one's role and DSN."""

    opened: list[tuple[str, str]]

    def connect(self, role: str, **extra: Any) -> Conn:
        conn = super().connect(role, **extra)
        self.opened.append((role, conn.info.dsn))
        return conn

    async def aconnect(self, role: str, **extra: Any) -> AsyncConn:
        conn = await super().aconnect(role, **extra)
        self.opened.append((role, conn.info.dsn))
        return conn


def test_worker_connections_carry_keepalives_and_an_application_name(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()

    @jobs.kind("ping", Ping)
    def ping(args: Ping, ctx: JobContext) -> None:
        pass

    opened: list[tuple[str, str]] = []

    def connector(conninfo: str, worker: str, threshold: int | None) -> Connector:
        made = RecordingConnector(conninfo, worker, threshold)
        made.opened = opened
        return made

    seams = WorkerSeams(connector=connector)
    with running_workers(jobs, migrated_url, poll_interval=0.1, seams=seams) as (worker,):
        wait_until(lambda: worker.listener is not None and worker.listener.connected.is_set())
        with clean.connect() as db:
            names = db.execute(
                text(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE application_name LIKE 'sqla-jobs %'"
                )
            ).scalars()
            roles = {n.split()[1] for n in names}
    assert {"claim", "listen", "leases", "reaper"} <= roles
    dsns = dict(opened)
    assert {"claim", "listen", "leases", "reaper"} <= set(dsns)
    # A half-open connection must end in an error the worker recovers from, not a hang.
    for role, dsn in opened:
        assert "keepalives=1" in dsn, role
        assert "keepalives_idle=30" in dsn, role
        assert f"application_name='sqla-jobs {role} {worker.name}'" in dsn or (
            f"application_name=sqla-jobs\\ {role}" in dsn
        ), dsn
    # The listener's liveness check fails within 5 s on a half-open connection, not ~60.
    assert "tcp_user_timeout=5000" in dsns["listen"]
