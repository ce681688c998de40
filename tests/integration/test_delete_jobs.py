"""``jobs.delete``: finished jobs deleted for good, in the caller's transaction, on a real
PostgreSQL; refusals (unknown ids, jobs not finished, a row of the application's still referencing
a job) change nothing and leave the transaction usable."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_jobs import JobNotFoundError, JobReferencedError, Jobs, JobStateError
from sqla_jobs.db.urls import sqlalchemy_url

from .test_operations import Task, dead_job, state
from .test_worker import enqueue, execute


def make_jobs() -> Jobs:
    jobs = Jobs()
    jobs.register("task", Task)
    return jobs


def test_delete_removes_dead_cancelled_and_kept_completed_jobs_and_a_rollback_brings_them_back(
    clean: Engine,
) -> None:
    jobs = make_jobs()
    dead = dead_job(clean, jobs)
    cancelled, completed = enqueue(clean, jobs, [Task(), Task()])
    execute(clean, "UPDATE sqla_jobs_job SET state = 'cancelled' WHERE id = :id", id=cancelled)
    execute(clean, "UPDATE sqla_jobs_job SET state = 'completed' WHERE id = :id", id=completed)
    wanted = sorted([dead, cancelled, completed])
    with Session(clean) as session:
        assert jobs.delete(session, wanted) == wanted
        session.rollback()
    assert [state(clean, i) for i in (dead, cancelled, completed)] == [
        "dead",
        "cancelled",
        "completed",
    ]
    with Session(clean) as session, session.begin():
        assert jobs.delete(session, wanted) == wanted
    assert [state(clean, i) for i in wanted] == [None, None, None]


def test_a_pending_or_unknown_job_refuses_the_whole_delete_and_the_transaction_stays_usable(
    clean: Engine,
) -> None:
    jobs = make_jobs()
    dead = dead_job(clean, jobs)
    (pending,) = enqueue(clean, jobs, [Task()])
    with Session(clean) as session, session.begin():
        with pytest.raises(JobStateError, match=f"cannot delete: job {pending} is pending"):
            jobs.delete(session, [dead, pending])
        with pytest.raises(JobNotFoundError, match="no job with id 999999999: nothing changed"):
            jobs.delete(session, [dead, 999999999])
        assert session.execute(text("SELECT 1")).scalar() == 1
    assert (state(clean, dead), state(clean, pending)) == ("dead", "pending")


def test_delete_by_filter_takes_only_the_dead_jobs_of_that_kind_and_queue(clean: Engine) -> None:
    jobs = make_jobs()
    other = Jobs()
    other.register("other", Task)
    mine, theirs = dead_job(clean, jobs), dead_job(clean, other)
    elsewhere = dead_job(clean, jobs)
    execute(clean, "UPDATE sqla_jobs_job SET queue = 'q2' WHERE id = :id", id=elsewhere)
    (pending,) = enqueue(clean, jobs, [Task()])
    with Session(clean) as session, session.begin():
        assert jobs.delete(session, kind="task", queue="default") == [mine]
    assert [state(clean, i) for i in (mine, theirs, elsewhere, pending)] == [
        None,
        "dead",
        "dead",
        "pending",
    ]


def test_a_job_still_referenced_by_an_application_row_is_kept_and_the_transaction_stays_usable(
    clean: Engine,
) -> None:
    jobs = make_jobs()
    dead, free = dead_job(clean, jobs), dead_job(clean, jobs)
    execute(
        clean,
        "CREATE TABLE IF NOT EXISTS app_receipt (id serial PRIMARY KEY, job_id bigint "
        "REFERENCES sqla_jobs_job (id) ON DELETE RESTRICT)",
    )
    try:
        execute(clean, "INSERT INTO app_receipt (job_id) VALUES (:id)", id=dead)
        with Session(clean) as session, session.begin():
            session.execute(text("INSERT INTO app_receipt (job_id) VALUES (NULL)"))
            with pytest.raises(JobReferencedError, match="cannot delete: a job is still") as err:
                jobs.delete(session, [dead, free])
            assert f"({dead})" in err.value.detail
            assert err.value.ids == sorted([dead, free])
            # The caller's own work before the refusal is still there, and more can follow.
            assert session.execute(text("SELECT count(*) FROM app_receipt")).scalar() == 2
            assert jobs.delete(session, [free]) == [free]
        assert (state(clean, dead), state(clean, free)) == ("dead", None)
    finally:
        execute(clean, "DROP TABLE app_receipt")


def test_delete_async_rides_the_async_session(clean: Engine, migrated_url: str) -> None:
    jobs = make_jobs()
    dead = dead_job(clean, jobs)

    async def main() -> list[int]:
        engine = create_async_engine(sqlalchemy_url(migrated_url))
        try:
            async with AsyncSession(engine) as session, session.begin():
                return await jobs.delete_async(session, [dead])
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == [dead]
    assert state(clean, dead) is None
