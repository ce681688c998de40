"""A small application for the acceptance tests, run by real worker processes:
``python -m sqla_jobs.cli worker tests.acceptance.app:jobs``.

Every handler writes what it does into ``acceptance_effects`` on ``DATABASE_URL``, each row in its
own committed transaction, so a test can see from outside the process which run did what even if
the process dies right after. Handlers stand in for real work by sleeping for the time their
payload asks for.
"""

from __future__ import annotations

import gc
import os
import time

import psycopg
from pydantic import BaseModel

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import libpq_conninfo

jobs = Jobs()

EFFECTS_TABLE = "acceptance_effects"
EFFECTS_DDL = f"""
CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    tag text NOT NULL,
    event text NOT NULL,
    attempt int NOT NULL,
    crashes int NOT NULL,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


class Work(BaseModel):
    """Work for ``seconds`` (``first_run_seconds`` on the job's first run, if given)."""

    tag: str
    seconds: float = 0.0
    first_run_seconds: float | None = None


class ExitProcess(BaseModel):
    """On the job's first run, end the whole worker process at once with ``code``, as a native
    crash or the OOM killer would: no cleanup, no lease given back."""

    tag: str
    code: int = 17


def effect(ctx: JobContext, tag: str, event: str) -> None:
    """Record ``event`` for the job, committed before this returns."""
    with psycopg.connect(libpq_conninfo(os.environ["DATABASE_URL"]), autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {EFFECTS_TABLE} (job_id, tag, event, attempt, crashes, pid) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (ctx.job_id, tag, event, ctx.attempt, ctx.crashes, os.getpid()),
        )


@jobs.kind("work", Work)
def work(args: Work, ctx: JobContext) -> None:
    effect(ctx, args.tag, "started")
    seconds = args.seconds
    if ctx.attempt == 1 and args.first_run_seconds is not None:
        seconds = args.first_run_seconds
    time.sleep(seconds)
    effect(ctx, args.tag, "finished")


@jobs.kind("exit_process", ExitProcess)
def exit_process(args: ExitProcess, ctx: JobContext) -> None:
    effect(ctx, args.tag, "started")
    if ctx.crashes == 0:
        os._exit(args.code)
    effect(ctx, args.tag, "finished")


class Heap(BaseModel):
    """Record how many objects the worker process has frozen out of garbage collection, and its
    young generation's threshold."""

    tag: str


@jobs.kind("heap", Heap)
def heap(args: Heap, ctx: JobContext) -> None:
    effect(ctx, args.tag, f"frozen={gc.get_freeze_count()} young={gc.get_threshold()[0]}")
