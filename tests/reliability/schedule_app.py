"""The application of the periodic-schedule chaos scenario (``test_periodic_chaos.py``), run in real
worker processes: ``python -m sqla_jobs.cli worker tests.reliability.schedule_app:jobs``.

One schedule, ticking every second; every worker process runs its scheduler. The tick's handler
records the start of each run, with its tick and the database clock, in ``schedule_runs``, works
for :data:`WORK_MS` (so that a worker killed at random often holds a tick's job), then records the
finished run in ``chaos_effects`` as the chaos app's handlers do. Each row is committed before the
handler goes on, so a test sees from outside which runs happened even when the process dies.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

from pydantic import BaseModel
from sqlalchemy import Engine, text

from sqla_jobs import JobContext, Jobs
from tests.reliability.chaos_app import _write, record_run, reset_tables

TARGET = "tests.reliability.schedule_app:jobs"
SCHEDULE = "chaos_tick"
INTERVAL = timedelta(seconds=1)
#: How long a tick's handler works.
WORK_MS = 300

jobs = Jobs()

TABLES_DDL = (
    "CREATE TABLE IF NOT EXISTS schedule_runs ("
    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL,"
    " tick timestamptz NOT NULL, attempt int NOT NULL, crashes int NOT NULL, pid int NOT NULL,"
    " started_at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (job_id, attempt, pid))",
)


class Tick(BaseModel):
    """The tick the job was enqueued for (the schedule builds the payload from it)."""

    tick: datetime


@jobs.periodic(every=INTERVAL, name=SCHEDULE, payload=lambda tick: Tick(tick=tick))
@jobs.kind(SCHEDULE, Tick)
def tick(args: Tick, ctx: JobContext) -> None:
    _write(
        "INSERT INTO schedule_runs (job_id, tick, attempt, crashes, pid) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (ctx.job_id, args.tick, ctx.attempt, ctx.crashes, os.getpid()),
    )
    time.sleep(WORK_MS / 1000)
    record_run(ctx)


def reset_schedule_tables(engine: Engine) -> None:
    """The chaos tables and the queue tables emptied, ``schedule_runs`` created and emptied, and
    no schedule state (the schedule starts from the first tick after its first scheduler starts)."""
    reset_tables(engine)
    with engine.begin() as conn:
        for ddl in TABLES_DDL:
            conn.execute(text(ddl))
        conn.execute(text("TRUNCATE schedule_runs, sqla_jobs_schedule"))
