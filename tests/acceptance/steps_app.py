"""A worker app for the durable-steps kill test: each step writes a row in its own transaction,
and the first run SIGKILLs its own process right after step two."""

from __future__ import annotations

import os
import signal

import psycopg
from pydantic import BaseModel

from sqla_jobs import Backoff, JobContext, Jobs
from sqla_jobs.db.urls import libpq_conninfo

jobs = Jobs()


class ThreeSteps(BaseModel):
    label: str


def _effect(step: str, attempt: int) -> str:
    with psycopg.connect(libpq_conninfo(os.environ["DATABASE_URL"]), autocommit=True) as conn:
        conn.execute("INSERT INTO step_effects (step, attempt) VALUES (%s, %s)", (step, attempt))
    return f"{step}-done"


@jobs.kind("three_steps", ThreeSteps, backoff=Backoff(base=1, cap_seconds=0))
def three_steps(args: ThreeSteps, ctx: JobContext) -> None:
    ctx.step("one", _effect, "one", ctx.attempt)
    ctx.step("two", _effect, "two", ctx.attempt)
    if ctx.crashes == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.step("three", _effect, "three", ctx.attempt)
    _effect(f"finished crashes={ctx.crashes}", ctx.attempt)
