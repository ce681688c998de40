"""register(): with a handler (a function or a lambda), or without one (an enqueue-only process)."""

from __future__ import annotations

from pydantic import BaseModel

from sqla_jobs import Backoff, JobContext, Jobs, Kind, Unique

jobs = Jobs()


class Ping(BaseModel):
    n: int = 0


class Pong(BaseModel):
    n: int = 0


class Tenant(BaseModel):
    tenant: str


def ping(payload: Ping, ctx: JobContext) -> None:
    pass


async def pong(payload: Pong, ctx: JobContext) -> None:
    pass


kind: Kind = jobs.register("ping", Ping, ping, queue="q", backoff=Backoff())
jobs.register("pong", Pong, pong, unique=False)
# Without a handler: the options still check against the model.
jobs.register("tenant", Tenant, concurrency_key=lambda p: p.tenant, unique=Unique(by=("tenant",)))


class Note(BaseModel):
    text: str


jobs.register("note", Note, lambda payload, ctx: print(payload.text, ctx.attempt))
