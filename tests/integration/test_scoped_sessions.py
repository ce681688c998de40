"""A ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) and an ``async_scoped_session`` work
wherever a ``Session`` or an ``AsyncSession`` does, against a real PostgreSQL: the job rides the
transaction of the scope's current session, committed and rolled back with the business rows."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import async_scoped_session, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from sqla_jobs import Job, JobContext, Jobs, Unique, testing
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.enqueue.insert import COPY_THRESHOLD

BUSINESS = "scoped_session_invoice"


class Ping(BaseModel):
    n: int


class Refresh(BaseModel):
    order_id: int


class Beat(BaseModel):
    pass


JOBS = Jobs()
JOBS.register("ping", Ping)
JOBS.register("refresh", Refresh, unique=Unique(by=("order_id",)))
RAN: list[int] = []


@JOBS.kind("beat", Beat)
def beat(args: Beat, ctx: JobContext) -> None:
    RAN.append(ctx.job_id)


JOBS.add_periodic("beat", every=timedelta(hours=1))


class AppSession(Session):
    """A Session subclass, as Flask-SQLAlchemy's ``db.session`` scopes one."""


@pytest.fixture
def business(clean: Engine) -> Engine:
    """The engine, with empty queue tables and an empty business table."""
    with clean.begin() as conn:
        conn.execute(
            text(f"CREATE TABLE IF NOT EXISTS {BUSINESS} (id serial PRIMARY KEY, total int)")
        )
        conn.execute(text(f"TRUNCATE {BUSINESS}, sqla_jobs_queue, sqla_jobs_schedule"))
    return clean


@pytest.fixture
def db_session(business: Engine) -> Iterator[scoped_session[AppSession]]:
    """A thread-scoped session, as an application's ``db.session``; removed at the end."""
    scoped = scoped_session(sessionmaker(business, class_=AppSession))
    yield scoped
    scoped.remove()


def committed(engine: Engine) -> tuple[list[tuple[int, str]], list[int]]:
    """The committed jobs (id, kind) and business rows (total), read on a connection of its own."""
    with engine.connect() as conn:
        jobs = [(r[0], r[1]) for r in conn.execute(text("SELECT id, kind FROM sqla_jobs_job"))]
        totals = list(conn.scalars(text(f"SELECT total FROM {BUSINESS} ORDER BY id")))
    return sorted(jobs), totals


def add_invoice(session: Any, total: int) -> None:
    session.execute(text(f"INSERT INTO {BUSINESS} (total) VALUES (:t)"), {"t": total})


def test_a_job_enqueued_through_a_scoped_session_is_visible_only_after_its_commit(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    add_invoice(db_session, 10)
    job = JOBS.enqueue(db_session, Ping(n=1))
    assert job.id is not None
    assert db_session.get(Job, job.id) is job, "the job is in the scope's current session"
    assert testing.enqueued(db_session, "ping") == [job]
    assert committed(business) == ([], [])
    db_session.commit()
    assert committed(business) == ([(job.id, "ping")], [10])


def test_a_rollback_of_a_scoped_session_discards_its_jobs_with_the_business_rows(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    add_invoice(db_session, 10)
    JOBS.enqueue(db_session, Ping(n=1))
    JOBS.enqueue(db_session, "ping", {"n": 2})
    JOBS.enqueue_many(db_session, [Ping(n=i) for i in range(3)])
    JOBS.enqueue(db_session, Refresh(order_id=1))
    assert len(testing.enqueued(db_session)) == 6
    db_session.rollback()
    assert committed(business) == ([], [])
    assert testing.enqueued(db_session) == []


def test_enqueue_many_through_a_scoped_session_by_insert_and_by_copy(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    few = JOBS.enqueue_many(db_session, [Ping(n=i) for i in range(3)])
    many = JOBS.enqueue_many(db_session, [Ping(n=i) for i in range(COPY_THRESHOLD + 1)])
    mixed = JOBS.enqueue_many(db_session, [Refresh(order_id=7), Ping(n=0), Refresh(order_id=7)])
    db_session.commit()
    ids = [i for i, _ in committed(business)[0]]
    assert sorted([*few, *many, mixed[0], mixed[1]]) == ids
    assert mixed.inserted == [True, True, False]


def test_a_unique_enqueue_through_a_scoped_session_finds_the_job_holding_its_key(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    first = JOBS.enqueue(db_session, Refresh(order_id=1))
    assert first.inserted is True
    again = JOBS.enqueue(db_session, Refresh(order_id=1))
    assert again.inserted is False
    assert again.id == first.id
    db_session.commit()
    assert committed(business)[0] == [(first.id, "refresh")]


def test_retry_cancel_pause_resume_and_get_through_a_scoped_session(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    dead, pending = (JOBS.enqueue(db_session, Ping(n=i)).id for i in range(2))
    db_session.commit()
    with business.begin() as conn:
        conn.execute(text("UPDATE sqla_jobs_job SET state = 'dead' WHERE id = :id"), {"id": dead})
    assert JOBS.retry(db_session, [dead]) == [dead]
    assert JOBS.cancel(db_session, [pending]).cancelled == [pending]
    JOBS.pause_queue(db_session, "default")
    db_session.rollback()
    assert JOBS.get(db_session, dead).state == "dead"  # type: ignore[union-attr]
    assert JOBS.get(db_session, pending).state == "pending"  # type: ignore[union-attr]
    JOBS.retry(db_session, [dead])
    JOBS.cancel(db_session, [pending])
    JOBS.pause_queue(db_session, "default")
    JOBS.resume_queue(db_session, "other")
    db_session.commit()
    db_session.expire_all()
    assert JOBS.get(db_session, dead).state == "pending"  # type: ignore[union-attr]
    assert JOBS.get(db_session, pending).state == "cancelled"  # type: ignore[union-attr]
    with business.connect() as conn:
        rows = conn.execute(text("SELECT queue, paused_at IS NOT NULL FROM sqla_jobs_queue"))
        paused = {queue: is_paused for queue, is_paused in rows}
    # Resuming a queue that was not paused writes nothing: no row for "other".
    assert paused == {"default": True}


def test_schedules_are_listed_run_and_paused_through_a_scoped_session(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    [info] = JOBS.list_schedules(db_session)
    assert info.name == "beat"
    job = JOBS.run_schedule(db_session, "beat")
    JOBS.pause_schedule(db_session, "beat")
    JOBS.resume_schedule(db_session, "beat")
    db_session.commit()
    assert committed(business)[0] == [(job.id, "beat")]


def test_run_jobs_runs_what_a_scoped_session_enqueued_in_its_own_transaction(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    RAN.clear()
    job_id = JOBS.enqueue(db_session, Beat()).id
    result = testing.run_jobs(JOBS, db_session, queues=["default"])
    assert (result.done, RAN) == (1, [job_id])
    db_session.rollback()
    assert committed(business) == ([], [])


def test_each_thread_of_a_scoped_session_enqueues_in_its_own_transaction(
    business: Engine, db_session: scoped_session[AppSession]
) -> None:
    """The scope is resolved at each call: one thread's rollback leaves another's commit alone."""
    kept: list[int] = []
    errors: list[BaseException] = []

    def request(n: int, commit: bool) -> None:
        try:
            add_invoice(db_session, n)
            job = JOBS.enqueue(db_session, Ping(n=n))
            if commit:
                db_session.commit()
                kept.append(job.id)
            else:
                db_session.rollback()
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)
        finally:
            db_session.remove()

    threads = [threading.Thread(target=request, args=(n, n == 1)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert committed(business) == ([(kept[0], "ping")], [1])


def test_the_async_calls_take_an_async_scoped_session(business: Engine, migrated_url: str) -> None:
    async def main() -> tuple[int, int, list[int], list[int], Job | None]:
        engine = create_async_engine(sqlalchemy_url(migrated_url))
        scoped = async_scoped_session(
            async_sessionmaker(engine, expire_on_commit=False), scopefunc=asyncio.current_task
        )
        try:
            await scoped.execute(text(f"INSERT INTO {BUSINESS} (total) VALUES (1)"))
            dropped = await JOBS.enqueue_async(scoped, Ping(n=1))
            await JOBS.enqueue_many_async(scoped, [Ping(n=2), Refresh(order_id=2)])
            await scoped.rollback()
            await scoped.execute(text(f"INSERT INTO {BUSINESS} (total) VALUES (2)"))
            kept = await JOBS.enqueue_async(scoped, Refresh(order_id=3))
            held = await JOBS.enqueue_async(scoped, Refresh(order_id=3))
            assert (held.inserted, held.id) == (False, kept.id)
            ids = await JOBS.enqueue_many_async(scoped, [Ping(n=i) for i in range(3)])
            await scoped.commit()
            cancelled = (await JOBS.cancel_async(scoped, [ids[0]])).cancelled
            await JOBS.pause_queue_async(scoped, "default")
            await JOBS.resume_queue_async(scoped, "default")
            await scoped.commit()
            await JOBS.retry_async(scoped, [ids[0]])
            await scoped.commit()
            got = await JOBS.get_async(scoped, kept.id)
            return dropped.id, kept.id, list(ids), cancelled, got
        finally:
            await scoped.remove()
            await engine.dispose()

    dropped, kept, ids, cancelled, got = asyncio.run(main())
    jobs, totals = committed(business)
    assert totals == [2], "the rolled-back business row went with its jobs"
    assert dropped not in {i for i, _ in jobs}
    assert sorted(i for i, _ in jobs) == sorted([kept, *ids])
    assert cancelled == [ids[0]]
    assert got is not None
    assert got.id == kept
