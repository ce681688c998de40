"""The application of the SIGKILL scenarios for handlers that take a Session
(``python -m sqla_jobs.cli worker tests.reliability.session_app:jobs``).

Every job adds one to its own counter row, ``app_counter.n`` (one row per job, named by the
payload's ``counter``), then works for ``ms`` milliseconds, so a SIGKILL is likely to land after
the write and before the job's completion:

- ``session_bump`` and its async twin ``session_bump_async`` take the Session the worker gives
  them: the write and the job's completion commit in one transaction, so a kill between the two
  rolls the write back with the run.
- ``plain_bump`` is the control: a ``(payload, ctx)`` handler that opens its own Session and
  commits the write before it returns, so a kill between its commit and the job's completion
  leaves the write behind, and the job's next run writes again.

Each write names its job in a SQL comment (``/* job 42 */``): while a handler's transaction is
open, ``pg_stat_activity.query`` of its backend tells the test which job's write it holds.
"""

from __future__ import annotations

import asyncio
import os
import time

from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import sqlalchemy_url

TARGET = "tests.reliability.session_app:jobs"
#: Kills may hit a job several times; it must never go dead for it here.
MAX_CRASHES = 50

jobs = Jobs()

COUNTER_DDL = (
    "DROP TABLE IF EXISTS app_counter",
    "CREATE TABLE app_counter (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)",
)


class Bump(BaseModel):
    """Add one to counter ``counter``, then work for ``ms`` milliseconds."""

    counter: int
    ms: int = 0


class AsyncBump(Bump):
    """:class:`Bump`, for the async twin."""


class PlainBump(Bump):
    """:class:`Bump`, for the control."""


def bump_statement(ctx: JobContext) -> str:
    # The job id as a literal comment: a bound parameter would show as $1 in pg_stat_activity.
    return f"UPDATE app_counter SET n = n + 1 WHERE id = :id /* job {int(ctx.job_id)} */"


@jobs.kind("session_bump", Bump, max_crashes=MAX_CRASHES)
def session_bump(args: Bump, ctx: JobContext, session: Session) -> None:
    session.execute(text(bump_statement(ctx)), {"id": args.counter})
    time.sleep(args.ms / 1000)  # the rest of the work, inside the transaction


@jobs.kind("session_bump_async", AsyncBump, max_crashes=MAX_CRASHES)
async def session_bump_async(args: AsyncBump, ctx: JobContext, session: AsyncSession) -> None:
    await session.execute(text(bump_statement(ctx)), {"id": args.counter})
    await asyncio.sleep(args.ms / 1000)


_engine: Engine | None = None


def _own_engine() -> Engine:
    global _engine
    if _engine is None:
        _engine = create_engine(sqlalchemy_url(os.environ["DATABASE_URL"]))
    return _engine


@jobs.kind("plain_bump", PlainBump, max_crashes=MAX_CRASHES)
def plain_bump(args: PlainBump, ctx: JobContext) -> None:
    with Session(_own_engine()) as session, session.begin():
        session.execute(text(bump_statement(ctx)), {"id": args.counter})
    time.sleep(args.ms / 1000)  # committed already; the job completes after this returns
