"""The application of the failover scenarios (``tests.reliability.failover_app:jobs``), and the
steady enqueue that feeds it.

Each job carries a token, unique per enqueue attempt, and writes one row to ``fo_effects`` through
the handler Session: the write commits with the job's completion or not at all, so a token with two
rows took effect twice. A token names an enqueue across servers, where job ids may not (a sequence
advanced on a lost primary can hand out the same id again on its standby).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from alembic import command
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import sqlalchemy_url

TARGET = "tests.reliability.failover_app:jobs"

jobs = Jobs()

TABLES_DDL = (
    "CREATE TABLE fo_effects ("
    " token bigint NOT NULL, job_id bigint NOT NULL, attempt int NOT NULL, crashes int NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
)


class Effect(BaseModel):
    """Write token ``token``'s effect, then work for ``ms`` milliseconds (inside the transaction)."""

    token: int
    ms: int = 0


@jobs.kind("fo_effect", Effect)
def effect(args: Effect, ctx: JobContext, session: Session) -> None:
    session.execute(
        text("INSERT INTO fo_effects (token, job_id, attempt, crashes) VALUES (:t, :j, :a, :c)"),
        {"t": args.token, "j": ctx.job_id, "a": ctx.attempt, "c": ctx.crashes},
    )
    time.sleep(args.ms / 1000)


def prepare(url: str) -> None:
    """Migrate the database at ``url`` and create the scenario's table (the servers' template)."""
    from tests.conftest import alembic_config

    command.upgrade(alembic_config(url), "head")
    eng = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with eng.begin() as conn:
        for ddl in TABLES_DDL:
            conn.execute(text(ddl))
    eng.dispose()


@dataclass
class Enqueuer:
    """A thread enqueuing one job per transaction at a steady rate on ``url`` (multi-host), as an
    application would, with a pool that pings its connections; it sorts every enqueue by what its
    commit answered.

    - ``acked``: the commit returned: the job must take effect exactly once (with synchronous
      replication);
    - ``unknown``: the connection died during the commit: it may or may not have reached the
      standby; counted apart, never as lost or duplicated;
    - ``refused``: an error before the commit (read-only, no server): never enqueued.
    """

    url: str
    rate: float = 50.0
    ms: int = 20
    acked: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="enqueuer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        engine = create_engine(
            sqlalchemy_url(self.url),
            pool_pre_ping=True,
            pool_size=1,
            connect_args={"connect_timeout": 2},
        )
        token = 0
        try:
            while not self._stop.is_set():
                token += 1
                self._one(engine, token)
                self._stop.wait(1 / self.rate)
        finally:
            engine.dispose()

    def _one(self, engine: Engine, token: int) -> None:
        session = Session(engine)
        committing = False
        try:
            jobs.enqueue(session, Effect(token=token, ms=self.ms))
            committing = True
            session.commit()
            self.acked.append(token)
        except SQLAlchemyError as exc:
            (self.unknown if committing else self.refused).append(token)
            if len(self.errors) < 50:
                self.errors.append(type(getattr(exc, "orig", None) or exc).__name__)
            # A refused enqueue (no primary yet) is retried at the rate, not in a tight loop.
            self._stop.wait(0.1)
        finally:
            # The pool's rollback on return can meet the server's AdminShutdown: the connection
            # is gone either way, and the enqueue's outcome is already sorted.
            with contextlib.suppress(SQLAlchemyError):
                session.close()

    @property
    def count(self) -> int:
        return len(self.acked) + len(self.unknown) + len(self.refused)
