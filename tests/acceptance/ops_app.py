"""The application of the operations' acceptance tests, run by real worker processes:
``python -m sqla_jobs.cli worker tests.acceptance.ops_app:jobs``.

Handlers record what they do in ``acceptance_effects`` (see :mod:`tests.acceptance.app`), so a test
sees from outside the process which run did what.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import psycopg
from pydantic import BaseModel

from sqla_jobs import JobCancelledError, JobContext, Jobs
from sqla_jobs.db.urls import libpq_conninfo
from tests.acceptance.app import EFFECTS_TABLE, effect

jobs = Jobs()
log = logging.getLogger("ops_app")

#: Longest a spinning or hanging handler runs when nobody cancels it.
FOREVER = 60.0


class Spin(BaseModel):
    tag: str


class Hang(BaseModel):
    tag: str


class Fragile(BaseModel):
    tag: str


class Note(BaseModel):
    tag: str


@jobs.kind("spin", Spin, queue="ops")
def spin(args: Spin, ctx: JobContext) -> None:
    """A sync handler that works in small steps and stops when its job is cancelled."""
    effect(ctx, args.tag, "started")
    deadline = time.monotonic() + FOREVER
    while time.monotonic() < deadline:
        if ctx.cancelled.wait(0.05):
            effect(ctx, args.tag, "saw_cancel")
            raise JobCancelledError(f"job {ctx.job_id} cancelled")
    effect(ctx, args.tag, "finished")


@jobs.kind("hang", Hang, queue="ops")
async def hang(args: Hang, ctx: JobContext) -> None:
    """An async handler that just awaits: a cancel cancels its task."""
    effect(ctx, args.tag, "started")
    await asyncio.sleep(FOREVER)
    effect(ctx, args.tag, "finished")


@jobs.kind("fragile", Fragile, queue="ops", max_attempts=1)
def fragile(args: Fragile, ctx: JobContext) -> None:
    """Fails on the job's first run ever (so, with one attempt, it goes dead); succeeds after."""
    with psycopg.connect(libpq_conninfo(os.environ["DATABASE_URL"]), autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {EFFECTS_TABLE} WHERE job_id = %s AND event = 'failed'",
            (ctx.job_id,),
        ).fetchone()
    if row is None or row[0] == 0:
        effect(ctx, args.tag, "failed")
        raise RuntimeError("first run fails")
    effect(ctx, args.tag, "finished")


@jobs.kind("note", Note, queue="ops")
def note(args: Note, ctx: JobContext) -> None:
    """Records that it ran, and says so through the application's own logger."""
    log.info("noted %s", args.tag, extra={"event": "noted", "job_id": ctx.job_id})
    effect(ctx, args.tag, "finished")
