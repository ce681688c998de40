"""``testing.run_jobs`` runs a graph of dependencies in one call, in dependency order, inside the
test's transaction that never commits: each pass settles the children of the parents it ended
(their deferred triggers run as a commit would run them), and the next pass runs those released.
A dead parent's children end cancelled, as under a worker."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, testing


class Step(BaseModel):
    n: int


class Boom(BaseModel):
    n: int


class InSession(BaseModel):
    n: int


def _graph_jobs() -> tuple[Jobs, list[int]]:
    jobs = Jobs()
    ran: list[int] = []

    @jobs.kind("step", Step)
    def step(args: Step, ctx: JobContext) -> None:
        ran.append(args.n)

    @jobs.kind("boom", Boom, max_attempts=1)
    def boom(args: Boom, ctx: JobContext) -> None:
        ran.append(args.n)
        raise RuntimeError("boom")

    @jobs.kind("step_in_session", InSession, queue="other")
    def in_session(args: InSession, ctx: JobContext, session: Session) -> None:
        ran.append(args.n)

    return jobs, ran


def _state(session: Session, job_id: int) -> str | None:
    found = session.execute(text("SELECT state FROM sqla_jobs_job WHERE id = :id"), {"id": job_id})
    return found.scalar()


def test_a_chain_runs_in_order_within_one_run_jobs_call(clean: Engine) -> None:
    jobs, ran = _graph_jobs()
    with Session(clean) as session, session.begin():
        ids = [j.id for j in jobs.chain(session, [Step(n=3), Step(n=2), Step(n=1)])]
        assert [_state(session, i) for i in ids] == ["pending", "waiting", "waiting"]
        result = testing.run_jobs(jobs, session)
        assert (result.done, result.failed, result.dead) == (3, 0, 0)
        assert ran == [3, 2, 1]
        assert [_state(session, i) for i in ids] == [None, None, None]
        session.rollback()


def test_a_fan_in_across_queues_and_session_handlers_runs_its_tail_last(clean: Engine) -> None:
    jobs, ran = _graph_jobs()
    with Session(clean) as session, session.begin():
        first = jobs.enqueue(session, Step(n=1)).id
        second = jobs.enqueue(session, InSession(n=2)).id
        jobs.enqueue(session, Step(n=9), depends_on=[first, second])
        assert testing.run_jobs(jobs, session).done == 3
        assert sorted(ran[:2]) == [1, 2]
        assert ran[2] == 9
        session.rollback()


def test_a_child_of_a_delayed_parent_waits_until_time_moves_past_its_parent(
    clean: Engine,
) -> None:
    jobs, ran = _graph_jobs()
    with Session(clean) as session, session.begin():
        parent = jobs.enqueue(session, Step(n=1), delay=3600).id
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent]).id
        assert testing.run_jobs(jobs, session).done == 0
        assert _state(session, child) == "waiting"
        assert testing.run_jobs(jobs, session, until=3600).done == 2
        assert ran == [1, 2]
        session.rollback()


def test_a_dead_parents_children_end_cancelled_and_a_run_anyway_child_runs(
    clean: Engine,
) -> None:
    jobs, ran = _graph_jobs()
    with Session(clean) as session, session.begin():
        parent = jobs.enqueue(session, Boom(n=1)).id
        cancelled = jobs.enqueue(session, Step(n=2), depends_on=[parent]).id
        grandchild = jobs.enqueue(session, Step(n=3), depends_on=[cancelled]).id
        anyway = jobs.enqueue(session, Step(n=4), depends_on=[parent], on_parent_failure="run").id
        result = testing.run_jobs(jobs, session, raise_errors=False)
        assert (result.done, result.dead) == (1, 1)
        assert ran == [1, 4]
        assert _state(session, cancelled) == "cancelled"
        assert _state(session, grandchild) == "cancelled"
        assert _state(session, anyway) is None
        session.rollback()


def test_a_parent_that_raises_has_cancelled_its_children_before_run_jobs_raises(
    clean: Engine,
) -> None:
    jobs, ran = _graph_jobs()
    with Session(clean) as session, session.begin():
        parent = jobs.enqueue(session, Boom(n=1)).id
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent]).id
        with pytest.raises(RuntimeError, match="boom"):
            testing.run_jobs(jobs, session)
        assert _state(session, child) == "cancelled"
        assert ran == [1]
        session.rollback()


def test_a_retried_failure_without_dependents_still_runs_once_per_call(clean: Engine) -> None:
    jobs = Jobs()
    runs: list[int] = []

    @jobs.kind("flaky", Step, max_attempts=5)
    def flaky(args: Step, ctx: JobContext) -> None:
        runs.append(args.n)
        raise RuntimeError("again")

    with Session(clean) as session, session.begin():
        jobs.enqueue(session, Step(n=1))
        result = testing.run_jobs(jobs, session, raise_errors=False, include_delayed=True)
        assert (result.failed, runs) == (1, [1])
        session.rollback()
