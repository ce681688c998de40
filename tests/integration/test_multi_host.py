"""SQLAlchemy's multi-host URL (``?host=h1:5432&host=h2:5432&target_session_attrs=read-write``)
reaches the server through every connection the library opens, when its first host refuses
connections: the claim lanes, the listener, the leases, the reaper, the pruner, the scheduler, the
sampler, the notifier and the handlers' Sessions."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, Retention
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.metrics import Metrics
from tests._waiting import wait_until
from tests.integration._workers import running_workers

#: The ``application_name`` prefixes of every connection a worker (and the notifier) opens here.
ROLES = (
    "claim",
    "listen",
    "leases",
    "reaper",
    "pruner",
    "scheduler",
    "sampler",
    "notifier",
)


class Stamp(BaseModel):
    n: int = 0


class Tick(BaseModel):
    at: str


def closed_port() -> int:
    """A local TCP port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def multi_host_url(url: str, attrs: str | None = "read-write") -> str:
    """``url``'s server as the second host of a multi-host URL whose first host is closed."""
    parsed = make_url(sqlalchemy_url(url))
    if parsed.host is None:
        pytest.skip("the server under test listens on a socket directory, not TCP")
    query = f"host=127.0.0.1:{closed_port()}&host={parsed.host}:{parsed.port or 5432}"
    if attrs is not None:
        query += f"&target_session_attrs={attrs}"
    return f"postgresql+psycopg://{parsed.username}@/{parsed.database}?{query}"


@pytest.fixture
def app_engine(migrated_url: str, clean: Engine) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(multi_host_url(migrated_url)))
    yield engine
    engine.dispose()


def test_every_connection_of_a_worker_reaches_the_server_through_a_multi_host_url(
    app_engine: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = multi_host_url(migrated_url)
    jobs = Jobs()
    ran: list[int] = []

    @jobs.kind("multi_host_stamp", Stamp, queue="multihost")
    def stamp(payload: Stamp, ctx: JobContext, session: Session) -> None:
        session.execute(text("SELECT 1"))
        ran.append(payload.n)

    @jobs.periodic(every=timedelta(hours=1), payload=lambda at: Tick(at=at.isoformat()))
    @jobs.kind("multi_host_tick", Tick, queue="multihost_ticks")
    def tick(payload: Tick, ctx: JobContext) -> None:
        pass

    seen: set[str] = set()

    def every_role_connected() -> bool:
        with app_engine.connect() as conn:
            names = conn.execute(
                text(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name LIKE 'sqla-jobs %'"
                )
            ).scalars()
            seen.update(str(n).split(" ")[1] for n in names)
        return set(ROLES) <= seen

    with (
        caplog.at_level(logging.WARNING, logger="sqla_jobs"),
        running_workers(
            jobs,
            url,
            queues=["multihost"],
            poll_interval=0.2,
            retention=Retention(),
            prune_interval=0.5,
            metrics=Metrics(port=0, sample_interval=0.2),
        ),
    ):
        with Session(app_engine) as session, session.begin():
            jobs.enqueue(session, Stamp(n=1))
        wait_until(lambda: ran == [1], what="the job run")
        wait_until(every_role_connected, what=f"every role connected (seen: {seen})")
    hosts = [r for r in caplog.records if getattr(r, "event", None) == "url_hosts"]
    assert hosts == [], "a URL with target_session_attrs=read-write was warned about"


def test_a_worker_warns_about_several_hosts_without_target_session_attrs(
    migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = Jobs()
    jobs.register("multi_host_idle", Stamp, lambda payload, ctx: None, queue="multihost_idle")
    started = time.monotonic()
    url = multi_host_url(migrated_url, attrs=None)
    with caplog.at_level(logging.WARNING, logger="sqla_jobs"), running_workers(jobs, url):
        pass
    hosts = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "url_hosts"]
    assert len(hosts) == 1, hosts
    assert "target_session_attrs=read-write" in hosts[0]
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(("attrs", "warned"), [(None, 1), ("read-write", 0), ("primary", 0)])
def test_the_dashboard_warns_about_several_hosts_without_target_session_attrs(
    migrated_url: str, caplog: pytest.LogCaptureFixture, attrs: str | None, warned: int
) -> None:
    """The dashboard's actions write: after a failover they must reach the new primary, so a URL
    that lets libpq settle on whichever host answers first is said once, and its pages still
    answer through it."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from sqla_jobs.dashboard import create_app

    url = multi_host_url(migrated_url, attrs=attrs)
    with caplog.at_level(logging.WARNING, logger="sqla_jobs"), TestClient(create_app(url)) as app:
        assert app.get("/").status_code == 200
    hosts = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "url_hosts"]
    assert len(hosts) == warned, hosts
    assert all("target_session_attrs=read-write" in h for h in hosts)
