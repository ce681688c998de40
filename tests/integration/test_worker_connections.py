"""The worker's long-lived connections are named and keep TCP keepalives on."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.connections import AsyncConn, Conn, Connector
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.testing import WorkerSeams
from sqla_jobs.worker.listener import Listener
from tests._waiting import DEADLINE

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


def recorded_worker() -> tuple[Jobs, list[tuple[str, str]], WorkerSeams]:
    """A ``Jobs`` with one kind, and seams whose connector records each connection it opens (role,
    DSN) in the list returned."""
    jobs = Jobs()

    @jobs.kind("ping", Ping)
    def ping(args: Ping, ctx: JobContext) -> None:
        pass

    opened: list[tuple[str, str]] = []

    def connector(conninfo: str, worker: str, threshold: int | None) -> Connector:
        made = RecordingConnector(conninfo, worker, threshold)
        made.opened = opened
        return made

    return jobs, opened, WorkerSeams(connector=connector)


def test_worker_connections_carry_keepalives_and_an_application_name(
    clean: Engine, migrated_url: str
) -> None:
    jobs, opened, seams = recorded_worker()
    with running_workers(jobs, migrated_url, poll_interval=0.1, seams=seams) as (worker,):
        wait_until(lambda: worker.listener is not None and worker.listener.connected.is_set())
        with clean.connect() as db:
            names = db.execute(
                text(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name LIKE 'sqla-jobs %'"
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


def test_the_connection_that_found_the_primary_is_the_first_claim_lane(
    clean: Engine, migrated_url: str
) -> None:
    """A start opens one asyncio connection before its first claim: the one that found a server
    that takes writes becomes lane 0's (it used to be closed, and a second one opened)."""
    jobs, opened, seams = recorded_worker()
    with running_workers(jobs, migrated_url, poll_interval=0.1, seams=seams) as (worker,):
        assert worker.started.wait(DEADLINE)
        assert worker.lanes is not None
        lane = worker.lanes.lanes[0].conn
        assert lane is not None
        pid = lane.info.backend_pid
        with clean.connect() as db:
            name = db.execute(
                text("SELECT application_name FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            ).scalar_one()
    claims = [role for role, _ in opened if role.startswith(("claim", "start"))]
    assert claims[0] == "claim", claims
    assert "start" not in claims, claims
    assert name == f"sqla-jobs claim {worker.name}"[:63]


def test_a_listen_connection_lost_before_its_first_look_is_logged_back(
    clean: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every ``listener_lost`` is followed by ``listener_back``, even when the very first
    connection is lost before it finished its first look (a supervisor waiting for the pair
    would otherwise wait forever)."""
    first_look = threading.Event()
    release = threading.Event()
    looks: list[int] = []

    def on_notify(conn: Conn, queues: list[str]) -> None:
        looks.append(conn.info.backend_pid)
        if len(looks) == 1:
            first_look.set()
            release.wait(DEADLINE)
            conn.execute("SELECT 1")  # as the worker's claim on this connection would

    listener = Listener(
        Connector(libpq_conninfo(migrated_url), "lost-early", 5),
        "sqla_jobs_test_channel",
        ["default"],
        on_notify,
        max_backoff=0.1,
    )
    with caplog.at_level(logging.INFO, logger="sqla_jobs.worker"):
        listener.start()
        try:
            assert first_look.wait(DEADLINE)
            with clean.connect() as db:
                db.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": looks[0]})
            release.set()
            wait_until(lambda: listener.connects == 1 and len(looks) == 2)
            events = [getattr(r, "event", None) for r in caplog.records]
            wait_until(
                lambda: "listener_back" in [getattr(r, "event", None) for r in caplog.records],
                what=f"listener_back after listener_lost (events: {events})",
            )
        finally:
            listener.stop()
            listener.join(DEADLINE)
