"""What an operation by filter would touch, counted before it runs (``operations.preview``), and a
run bounded by that count: the count and the run read one filter, so they agree; the count locks
and changes nothing; a bounded run touches none of the jobs that matched after the count."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_jobs import Jobs
from sqla_jobs.operations import jobs as ops
from sqla_jobs.operations.preview import preview

from ._dashboard import add_jobs, make_jobs, set_state
from .test_dashboard_bulk import dead_jobs, states


def test_the_count_agrees_with_what_the_run_touches_and_changes_nothing(clean: Engine) -> None:
    jobs: Jobs = make_jobs()
    dead = dead_jobs(clean, 3)
    (pending,) = add_jobs(clean, jobs)
    (elsewhere,) = dead_jobs(clean, 1, queue="other")
    with Session(clean) as session, session.begin():
        counted = preview(session, jobs._scope, "retry", queue="mail")
    assert counted.ids == dead
    assert counted.matching == {"dead": 3}
    assert not counted.capped
    assert states(clean, [*dead, pending, elsewhere]) == ["dead", "dead", "dead", "pending", "dead"]
    with Session(clean) as session, session.begin():
        assert jobs.retry(session, queue="mail") == counted.ids


def test_a_run_bounded_by_a_count_touches_only_the_jobs_counted(clean: Engine) -> None:
    """A job that matches after the count is left alone, even with a lower id than a counted
    one; a counted job that no longer matches is skipped."""
    jobs = make_jobs()
    first, second, third = dead_jobs(clean, 3)
    set_state(clean, first, "pending")
    with Session(clean) as session, session.begin():
        counted = preview(session, jobs._scope, "delete", queue="mail")
    assert counted.ids == [second, third]
    set_state(clean, first, "dead")  # matches since the count, below the highest counted id
    set_state(clean, third, "pending")  # counted, matches no more
    later = dead_jobs(clean, 1)
    with Session(clean) as session, session.begin():
        done = ops.delete(session, jobs._scope, None, queue="mail", bound=counted.bound())
    assert done == [second]
    assert states(clean, [first, second, third, *later]) == ["dead", None, "pending", "dead"]


def test_a_cancel_count_says_pending_and_running_apart(clean: Engine) -> None:
    jobs = make_jobs()
    pending, running = add_jobs(clean, jobs, 2)
    set_state(clean, running, "running")
    with Session(clean) as session, session.begin():
        counted = preview(session, jobs._scope, "cancel", queue="mail")
    assert counted.jobs() == "1 pending job and 1 running job"
    assert counted.lines() == [
        f"cancel 1 pending job and 1 running job (queue mail, any kind): ids {pending}, {running}"
    ]
