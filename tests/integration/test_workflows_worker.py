"""Job dependencies with real in-process workers: every path that ends a parent releases or
cancels its children in the same transaction, and a released child is woken at once (the
workers poll every 30 s, and each wait here is well under that)."""

from __future__ import annotations

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import wait_until
from tests.integration._workers import running_workers

from ._workflows import (
    QUIET_POLL,
    WOKEN_WITHIN,
    Step,
    enqueue,
    outcome,
    rows,
    state,
    workflow_jobs,
)


def test_a_chain_runs_in_order_each_step_woken_by_the_last(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = workflow_jobs()
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL):
        with Session(clean) as session:
            a = jobs.enqueue(session, Step(n=1))
            b = jobs.enqueue(session, Step(n=2), depends_on=[a])
            jobs.enqueue(session, Step(n=3), depends_on=[b])
            session.commit()
        for n in (1, 2, 3):
            assert runs.ran(n, WOKEN_WITHIN), f"step {n} not woken: runs {runs.order}"
    assert runs.order == [1, 2, 3]


def test_a_fan_in_of_300_parents_runs_its_child_once_after_the_last(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = workflow_jobs()
    with Session(clean, expire_on_commit=False) as session:
        parents = jobs.enqueue_many(session, [Step(n=i) for i in range(1, 301)], delay=3600)
        child = jobs.enqueue(session, Step(n=1000), depends_on=parents)
        session.commit()
    assert rows(clean, [child.id])[child.id]["waiting_on"] == 300
    with running_workers(jobs, migrated_url, count=4, poll_interval=0.05, concurrency=8):
        with clean.begin() as conn:  # all due at once: the four workers complete them together
            conn.execute(
                text("UPDATE sqla_jobs_job SET run_at = now() WHERE id = ANY(:ids)"),
                {"ids": list(parents)},
            )
        assert runs.ran(1000)
        wait_until(lambda: state(clean, child.id) is None, "the child completed")
    assert runs.order.count(1000) == 1
    assert runs.order[-1] == 1000
    assert sorted(runs.order[:-1]) == list(range(1, 301))


def test_a_dead_parent_cancels_its_dependents_transitively_but_not_a_run_anyway_child(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = workflow_jobs()
    with Session(clean, expire_on_commit=False) as session:
        parent = jobs.enqueue(session, "wf_fail", {"n": 1})
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent])
        grandchild = jobs.enqueue(session, Step(n=3), depends_on=[child])
        jobs.enqueue(session, Step(n=4), depends_on=[parent], on_parent_failure="run")
        session.commit()
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL):
        assert runs.ran(4, WOKEN_WITHIN)
    found = rows(clean, [parent.id, child.id, grandchild.id])
    assert found[parent.id]["state"] == "dead"
    assert found[child.id]["state"] == found[grandchild.id]["state"] == "cancelled"
    assert found[child.id]["errors"][-1]["parent"] == parent.id
    assert found[child.id]["errors"][-1]["parent_outcome"] == "dead"
    assert found[grandchild.id]["errors"][-1]["parent"] == child.id
    assert found[grandchild.id]["last_error"] == f"parent job {child.id} ended cancelled"
    assert 2 not in runs.order
    assert 3 not in runs.order


def test_a_discarded_parent_cancels_its_child(clean: Engine, migrated_url: str) -> None:
    jobs, runs = workflow_jobs()
    with Session(clean, expire_on_commit=False) as session:
        parent = jobs.enqueue(session, "wf_discard", {"n": 1})
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent])
        session.commit()
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        wait_until(lambda: state(clean, child.id) == "cancelled", "the child cancelled")
    assert outcome(clean, parent.id) == "dead"
    assert runs.order == [1]


def test_the_history_copy_releases_the_child(clean: Engine, migrated_url: str) -> None:
    jobs, runs = workflow_jobs()
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL, keep_history=True):
        with Session(clean, expire_on_commit=False) as session:
            a = jobs.enqueue(session, Step(n=1))
            jobs.enqueue(session, Step(n=2), depends_on=[a])
            session.commit()
        assert runs.ran(2, WOKEN_WITHIN)
    assert outcome(clean, a.id) == "completed"


def test_a_completion_in_the_handlers_session_releases_the_child(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = workflow_jobs()
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL):
        with Session(clean, expire_on_commit=False) as session:
            a = jobs.enqueue(session, "wf_session", {"n": 1})
            jobs.enqueue(session, "wf_session", {"n": 2}, depends_on=[a])
            session.commit()
        assert runs.ran(2, WOKEN_WITHIN)
    assert outcome(clean, a.id) == "completed"


def test_cancelling_a_parent_cancels_its_children_and_cancelling_a_child_nobody_else(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1, delay=3600)
    first = enqueue(clean, jobs, 2, depends_on=[parent])
    second = enqueue(clean, jobs, 3, depends_on=[parent])
    after_second = enqueue(clean, jobs, 4, depends_on=[second])
    with Session(clean) as session:
        assert jobs.cancel(session, [first]).cancelled == [first]
        session.commit()
    assert state(clean, parent) == "pending"
    assert state(clean, second) == "waiting"
    with Session(clean) as session:
        jobs.cancel(session, [parent])
        session.commit()
    assert state(clean, second) == state(clean, after_second) == "cancelled"
    assert rows(clean, [second])[second]["last_error"] == f"parent job {parent} ended cancelled"


def test_retrying_a_dead_parent_leaves_its_cancelled_children_cancelled(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = workflow_jobs()
    with Session(clean, expire_on_commit=False) as session:
        parent = jobs.enqueue(session, "wf_fail", {"n": 1})
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent])
        session.commit()
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        wait_until(lambda: state(clean, child.id) == "cancelled", "the child cancelled")
        with Session(clean) as session:
            assert jobs.retry(session, [parent.id]) == [parent.id]
            session.commit()
        wait_until(lambda: runs.order.count(1) == 2, "the parent ran again")
        wait_until(lambda: state(clean, parent.id) == "dead", "the parent dead again")
    assert state(clean, child.id) == "cancelled"
    assert 2 not in runs.order


def test_chain_and_group_helpers_build_the_common_shapes(clean: Engine, migrated_url: str) -> None:
    jobs, runs = workflow_jobs()
    with Session(clean, expire_on_commit=False) as session:
        steps = jobs.chain(session, [Step(n=1), Step(n=2), Step(n=3)])
        ids, final = jobs.group(
            session, [Step(n=10), Step(n=11)], then=Step(n=20), on_parent_failure="run"
        )
        session.commit()
    assert [s.state for s in steps] == ["pending", "waiting", "waiting"]
    assert final.state == "waiting"
    assert rows(clean, [final.id])[final.id]["waiting_on"] == len(ids) == 2
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL):
        assert runs.ran(3, WOKEN_WITHIN)
        assert runs.ran(20, WOKEN_WITHIN)
    assert runs.order.index(1) < runs.order.index(2) < runs.order.index(3)
    assert runs.order.index(20) > max(runs.order.index(10), runs.order.index(11))
