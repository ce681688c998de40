"""The worker's long-lived connections are named and keep TCP keepalives on."""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy import Engine, text

from sqla_jobs import JobContext, Jobs

from ._workers import running_workers, wait_until


class Ping(BaseModel):
    n: int = 0


def test_worker_connections_carry_keepalives_and_an_application_name(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()

    @jobs.kind("ping", Ping)
    def ping(args: Ping, ctx: JobContext) -> None:
        pass

    with running_workers(jobs, migrated_url, poll_interval=0.1) as (worker,):
        assert worker.listener is not None
        assert worker.leases is not None
        wait_until(lambda: worker.listener is not None and worker.listener.connected.is_set())
        # A half-open connection must end in an error the worker recovers from, not a hang.
        for conn in (worker._conn, worker.listener._conn):
            assert conn is not None
            dsn = conn.info.dsn
            assert "keepalives=1" in dsn
            assert "keepalives_idle=30" in dsn
        # The listener's liveness check fails within 5 s on a half-open connection, not ~60.
        assert "tcp_user_timeout=5000" in worker.listener._conn.info.dsn
        with clean.connect() as db:
            names = db.execute(
                text(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE application_name LIKE 'sqla-jobs %'"
                )
            ).scalars()
            roles = {n.split()[1] for n in names}
        assert {"claim", "listen", "leases"} <= roles
