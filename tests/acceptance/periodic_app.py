"""The application of the periodic-schedule acceptance tests, run by real worker processes:
``python -m sqla_jobs.cli worker tests.acceptance.periodic_app:jobs``.

Two schedules, each on a queue of its own: ``beat`` ticks every second, ``offbeat`` every four
seconds. Each payload carries its tick, and the handler records each run it starts in
``periodic_runs`` (schedule, job id, tick, attempt, pid, and the database clock at the start),
committed before it returns, so a test sees from outside the processes which tick ran when, on the
clock the scheduler plans by.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta

import psycopg
from pydantic import BaseModel

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import libpq_conninfo

jobs = Jobs()

#: Schedule names; each schedule's kind and queue are named after it.
BEAT = "beat"
OFFBEAT = "offbeat"
INTERVALS = {BEAT: timedelta(seconds=1), OFFBEAT: timedelta(seconds=4)}

RUNS_TABLE = "periodic_runs"
RUNS_DDL = f"""
CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule text NOT NULL,
    job_id bigint NOT NULL,
    tick timestamptz NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


class Beat(BaseModel):
    """The tick this job was enqueued for (the schedule builds the payload from it)."""

    tick: datetime


class Offbeat(BaseModel):
    """The tick this job was enqueued for (the schedule builds the payload from it)."""

    tick: datetime


_local = threading.local()


def _connection() -> psycopg.Connection[tuple[object, ...]]:
    """This handler thread's connection, opened once: a run's start is not delayed by a connect."""
    conn: psycopg.Connection[tuple[object, ...]] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conninfo = libpq_conninfo(os.environ["DATABASE_URL"])
        conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=5)
        _local.conn = conn
    return conn


def record_start(schedule: str, tick: datetime, ctx: JobContext) -> None:
    _connection().execute(
        f"INSERT INTO {RUNS_TABLE} (schedule, job_id, tick, attempt, pid) "
        "VALUES (%s, %s, %s, %s, %s)",
        (schedule, ctx.job_id, tick, ctx.attempt, os.getpid()),
    )


@jobs.periodic(every=INTERVALS[BEAT], name=BEAT, payload=lambda tick: Beat(tick=tick))
@jobs.kind(BEAT, Beat, queue=BEAT)
def beat(args: Beat, ctx: JobContext) -> None:
    record_start(BEAT, args.tick, ctx)


@jobs.periodic(every=INTERVALS[OFFBEAT], name=OFFBEAT, payload=lambda tick: Offbeat(tick=tick))
@jobs.kind(OFFBEAT, Offbeat, queue=OFFBEAT)
def offbeat(args: Offbeat, ctx: JobContext) -> None:
    record_start(OFFBEAT, args.tick, ctx)
