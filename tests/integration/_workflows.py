"""What the tests of job dependencies share: kinds that record their runs, and reads of the rows."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Discard, JobContext, Jobs
from sqla_jobs.sql import outcomes as outcomes_sql
from tests._waiting import DEADLINE

#: A poll interval no test waits out: a child run sooner was woken by its parent's completion.
QUIET_POLL = 30.0
#: How soon a released child must run: well under QUIET_POLL (only the NOTIFY explains it).
WOKEN_WITHIN = 15.0


class Step(BaseModel):
    n: int = 0


class Fails(Step):
    pass


class Discards(Step):
    pass


class InSession(Step):
    pass


class UniqueStep(Step):
    pass


class Runs:
    """The ``n`` of each run, in the order the handlers ran, and an event per ``n``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.order: list[int] = []
        self._events: dict[int, threading.Event] = {}

    def record(self, n: int) -> None:
        with self._lock:
            self.order.append(n)
            self._event(n).set()

    def _event(self, n: int) -> threading.Event:
        return self._events.setdefault(n, threading.Event())

    def ran(self, n: int, timeout: float = DEADLINE) -> bool:
        """Wait until a run of ``n`` is recorded (or ``timeout`` passes)."""
        with self._lock:
            event = self._event(n)
        return event.wait(timeout)


def workflow_jobs() -> tuple[Jobs, Runs]:
    """A ``Jobs`` whose kinds record their runs: ``wf_step`` succeeds, ``wf_fail`` fails once
    and is dead, ``wf_discard`` discards, ``wf_session`` succeeds in the handler's Session."""
    jobs = Jobs()
    runs = Runs()

    @jobs.kind("wf_step", Step)
    def step(args: Step, ctx: JobContext) -> None:
        runs.record(args.n)

    @jobs.kind("wf_fail", Fails, max_attempts=1)
    def fail(args: Fails, ctx: JobContext) -> None:
        runs.record(args.n)
        raise RuntimeError("boom")

    @jobs.kind("wf_discard", Discards)
    def discard(args: Discards, ctx: JobContext) -> None:
        runs.record(args.n)
        raise Discard("cannot heal")

    @jobs.kind("wf_session", InSession)
    def in_session(args: InSession, ctx: JobContext, session: Session) -> None:
        session.execute(text("SELECT 1"))
        runs.record(args.n)

    return jobs, runs


def rows(engine: Engine, ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The job rows ``ids`` that exist, by id (state, waiting_on, has_dependents, errors...)."""
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT * FROM sqla_jobs_job WHERE id = ANY(:ids)"), {"ids": list(ids)}
        ).mappings()
        return {r["id"]: dict(r) for r in found}


def state(engine: Engine, job_id: int) -> str | None:
    """The job's state, or None for no row."""
    found = rows(engine, [job_id]).get(job_id)
    return None if found is None else str(found["state"])


def outcome(engine: Engine, job_id: int) -> str | None:
    """The recorded outcome of ``job_id`` (None: none)."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT outcome FROM sqla_jobs_outcome WHERE id = :id"), {"id": job_id}
        ).scalar()


def claim_by_hand(conn: Any, job_id: int) -> uuid.UUID:
    """Put job ``job_id`` in ``running`` under a fresh lease token, as a claim does; returns the
    token (for the worker's own completion statement, :func:`complete_held`)."""
    token = uuid.uuid4()
    conn.execute(
        text(
            "UPDATE sqla_jobs_job SET state = 'running', lease_token = :t, attempts = attempts + 1,"
            " lease_expires_at = now() + interval '1 hour' WHERE id = :id"
        ),
        {"t": token, "id": job_id},
    )
    return token


def complete_held(conn: Any, job_id: int, token: uuid.UUID) -> list[int]:
    """The worker's batched completion statement for one job; returns the ids deleted."""
    return list(conn.execute(outcomes_sql.complete(), {"ids": [job_id], "token": token}).scalars())


def enqueue(engine: Engine, jobs: Jobs, n: int, kind: str = "wf_step", **options: Any) -> int:
    """Enqueue one job of ``kind`` with payload ``n`` in its own committed transaction."""
    with Session(engine) as session:
        job = jobs.enqueue(session, kind, {"n": n}, **options)
        session.commit()
        return job.id
