"""The sqla-jobs side of every measurement: one payload model, a no-op handler, and prefills;
the handlers that write one application row (the session measurement)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_jobs import JobContext, Jobs, RateLimit, Unique
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
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


def make_jobs(handler: Handler | None = None, *, wakeup: str | None = None, **options: Any) -> Jobs:
    """A ``Jobs`` with the one ``ping`` kind (handler: ``handler``, default :func:`noop`;
    ``options``: the kind's, such as ``queue`` or ``concurrency_limit``), waking workers as
    ``wakeup`` says (None: the default mode)."""
    jobs = Jobs() if wakeup is None else Jobs(wakeup=wakeup)  # type: ignore[arg-type]
    jobs.register(KIND, Ping, handler if handler is not None else noop, **options)
    return jobs


#: The unique kind of the enqueue bench: the same payload, one job per ``n``.
UNIQUE_KIND = "unique_ping"


class UniquePing(BaseModel):
    """:class:`Ping` of a kind declared unique by its ``n``."""

    n: int


def make_unique_jobs() -> Jobs:
    """A ``Jobs`` with the ``unique_ping`` kind, unique by ``n`` (no handler: enqueue only)."""
    jobs = Jobs()
    jobs.register(UNIQUE_KIND, UniquePing, unique=Unique(by=("n",)))
    return jobs


def make_engine(url: str) -> Engine:
    return create_engine(sqlalchemy_url(url))


#: The rate limit of the limited drain: 100,000 starts a second, which a drain never reaches, so
#: what it measures is the limited claim's own cost (the limiter row locked, its log rewritten).
LIMITED = RateLimit(1000, per=timedelta(milliseconds=10))


def prefill(
    subject: Subject, url: str, n: int, *, chunk: int = 10_000, limited: bool = False
) -> None:
    """Put ``n`` due jobs in ``subject``'s table, fast (not timed): enqueue_many or COPY;
    ``limited``: of the ping kind under :data:`LIMITED`."""
    if subject == "baseline":
        with psycopg.connect(libpq_conninfo(url)) as conn:
            baseline.copy_jobs(conn, KIND, (payload_dict(i) for i in range(n)))
        return
    jobs = make_jobs(rate_limit=LIMITED) if limited else make_jobs()
    engine = make_engine(url)
    try:
        for start in range(0, n, chunk):
            with Session(engine) as s, s.begin():
                jobs.enqueue_many(s, [Ping(n=i) for i in range(start, min(n, start + chunk))])
    finally:
        engine.dispose()


#: The application table the session measurement's handlers write one row to, per job.
APP_TABLE = "bench_app_row"
APP_DDL = f"CREATE TABLE {APP_TABLE} (job_id bigint PRIMARY KEY, n int NOT NULL)"
_WRITE = text(f"INSERT INTO {APP_TABLE} (job_id, n) VALUES (:job_id, :n)")

#: The handlers of the session measurement: a no-op, then one row written through the handler's
#: own Session (``plain``) or through the worker's (``session``); each sync and async.
HANDLERS = ("noop", "plain", "session", "noop-async", "plain-async", "session-async")


def write_jobs(name: str, url: str, pool_size: int) -> tuple[Jobs, Any]:
    """The ``ping`` kind with handler ``name`` (one of :data:`HANDLERS`), and the sessionmaker the
    worker gets (None for the handlers that take no Session).

    Every maker has ``pool_size`` connections, the worker's concurrency, as the worker's own
    default maker has: with SQLAlchemy's default of 5, the overflow connections of concurrency 16
    would be opened and closed per job, and that churn is not what is compared.
    """
    if name not in HANDLERS:
        raise ValueError(f"unknown handler {name!r}; choose from {', '.join(HANDLERS)}")
    if name.endswith("-async"):
        amaker = async_sessionmaker(create_async_engine(sqlalchemy_url(url), pool_size=pool_size))

        async def noop_async(args: Ping, ctx: JobContext) -> None:
            return None

        async def plain_async(args: Ping, ctx: JobContext) -> None:
            async with amaker() as session, session.begin():
                await session.execute(_WRITE, {"job_id": ctx.job_id, "n": args.n})

        async def in_session_async(args: Ping, ctx: JobContext, session: AsyncSession) -> None:
            await session.execute(_WRITE, {"job_id": ctx.job_id, "n": args.n})

        async_handlers: dict[str, Handler] = {
            "noop-async": noop_async,
            "plain-async": plain_async,
            "session-async": in_session_async,
        }
        return make_jobs(async_handlers[name]), amaker if name == "session-async" else None
    maker = sessionmaker(create_engine(sqlalchemy_url(url), pool_size=pool_size))

    def noop_sync(args: Ping, ctx: JobContext) -> None:
        return None

    def plain(args: Ping, ctx: JobContext) -> None:
        with maker() as session, session.begin():
            session.execute(_WRITE, {"job_id": ctx.job_id, "n": args.n})

    def in_session(args: Ping, ctx: JobContext, session: Session) -> None:
        session.execute(_WRITE, {"job_id": ctx.job_id, "n": args.n})

    handlers: dict[str, Handler] = {"noop": noop_sync, "plain": plain, "session": in_session}
    return make_jobs(handlers[name]), maker if name == "session" else None
