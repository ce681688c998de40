"""An application with rate limited kinds for the acceptance tests, run by real worker processes:
``python -m sqla_jobs.cli worker tests.acceptance.rate_limits_app:jobs``. The handlers do nothing:
the tests read each claim's time from the database."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from sqla_jobs import JobContext, Jobs, RateLimit

jobs = Jobs()

#: The window of both kinds.
PER = timedelta(seconds=1)


class Call(BaseModel):
    n: int


class Keyed(BaseModel):
    n: int
    key: str


@jobs.kind("call", Call, rate_limit=RateLimit(3, per=PER))
def call(payload: Call, ctx: JobContext) -> None:
    pass


@jobs.kind("keyed_call", Keyed, rate_limit=RateLimit(2, per=PER, by=lambda p: p.key))
def keyed_call(payload: Keyed, ctx: JobContext) -> None:
    pass
