"""``testing.run_jobs`` decides outcomes with the worker's own rules (``sqla_jobs._outcome``)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, testing


class Order(BaseModel):
    order_id: int


def _insert(session: Session, kind: str, payload: str) -> int:
    job_id: int = session.execute(
        text(
            "INSERT INTO sqla_jobs_job (kind, payload) VALUES (:k, CAST(:p AS jsonb)) RETURNING id"
        ),
        {"k": kind, "p": payload},
    ).scalar_one()
    return job_id


def _row(session: Session, job_id: int) -> tuple[str, int, float]:
    found = session.execute(
        text(
            "SELECT state, attempts, extract(epoch FROM run_at - now())::float"
            " FROM sqla_jobs_job WHERE id = :id"
        ),
        {"id": job_id},
    ).one()
    return found[0], found[1], found[2]


def test_run_jobs_makes_a_payload_that_no_longer_validates_dead_as_the_worker_does(
    clean: Engine,
) -> None:
    jobs = Jobs()
    jobs.register("order", Order, lambda args, ctx: None)
    with Session(clean) as session, session.begin():
        job_id = _insert(session, "order", '{"order_id": "not a number"}')
        result = testing.run_jobs(jobs, session, raise_errors=False)
        assert (result.done, result.failed, result.dead) == (0, 0, 1)
        assert isinstance(result.errors[0], testing.JobFailed)
        assert "no longer validates against Order" in str(result.errors[0])
        assert _row(session, job_id)[:2] == ("dead", 1)
        session.rollback()


def test_run_jobs_fails_an_unknown_kind_with_backoff_as_the_worker_does(clean: Engine) -> None:
    jobs = Jobs()

    @jobs.kind("order", Order)
    def order(args: Order, ctx: JobContext) -> None:
        pass

    with Session(clean) as session, session.begin():
        job_id = _insert(session, "from_a_newer_deploy", "{}")
        with pytest.raises(testing.JobFailed, match="unknown kind 'from_a_newer_deploy'"):
            testing.run_jobs(jobs, session)
        state, attempts, due_in = _row(session, job_id)
        assert (state, attempts) == ("pending", 1)
        assert due_in > 0, "backed off, as the worker backs off an unknown kind"
        session.rollback()
