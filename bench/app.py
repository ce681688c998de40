"""The sqla-jobs side of every measurement: one payload model, a no-op handler, and prefills."""

from __future__ import annotations

from typing import Any

import psycopg
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from sqla_jobs import Jobs
from sqla_jobs._db import libpq_conninfo, sqlalchemy_url
from sqla_jobs.kinds import Handler

from . import baseline
from .dbs import Subject

KIND = "ping"


class Ping(BaseModel):
    """The benchmark's payload: small, like an id and a tag."""

    n: int
    tag: str = "bench"


def payload_dict(n: int) -> dict[str, Any]:
    """The same payload as :class:`Ping`, as the baseline stores it."""
    return {"n": n, "tag": "bench"}


async def noop(args: Ping, ctx: object) -> None:
    """A handler that does nothing: the benchmarks measure the queue, not the work."""
    return None


def make_jobs(handler: Handler | None = None) -> Jobs:
    """A ``Jobs`` with the one ``ping`` kind (handler: ``handler``, default :func:`noop`)."""
    jobs = Jobs()
    jobs.register(KIND, Ping, handler if handler is not None else noop)
    return jobs


def make_engine(url: str) -> Engine:
    return create_engine(sqlalchemy_url(url))


def prefill(subject: Subject, url: str, n: int, *, chunk: int = 10_000) -> None:
    """Put ``n`` due jobs in ``subject``'s table, fast (not timed): enqueue_many or COPY."""
    if subject == "baseline":
        with psycopg.connect(libpq_conninfo(url)) as conn:
            baseline.copy_jobs(conn, KIND, (payload_dict(i) for i in range(n)))
        return
    jobs = make_jobs()
    engine = make_engine(url)
    try:
        for start in range(0, n, chunk):
            with Session(engine) as s, s.begin():
                jobs.enqueue_many(s, [Ping(n=i) for i in range(start, min(n, start + chunk))])
    finally:
        engine.dispose()
