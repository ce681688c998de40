"""@jobs.periodic above @jobs.kind keeps the handler's type."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from pydantic import BaseModel
from typing_extensions import assert_type

from sqla_jobs import JobContext, Jobs

jobs = Jobs()


class Tick(BaseModel):
    pass


@jobs.periodic("*/5 * * * *", missed="once")
@jobs.kind("tick", Tick, queue="cron")
def tick(payload: Tick, ctx: JobContext) -> None:
    pass


assert_type(tick, Callable[[Tick, JobContext], None])


class Sweep(BaseModel):
    pass


@jobs.periodic(every=timedelta(minutes=1))
@jobs.kind("sweep", Sweep)
async def sweep(payload: Sweep, ctx: JobContext) -> None:
    pass


jobs.add_periodic("tick", every=timedelta(hours=1), name="hourly_tick")
