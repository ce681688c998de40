"""``depends_on`` at enqueue, against a real PostgreSQL: where a child starts, what a parent that
finished before it says, the errors that leave the transaction usable, uniqueness, and the claim
that never takes a waiting job."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_jobs import DependencyError, InvalidOptionError, JobContext, Retention, Unique
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
from sqla_jobs.worker.pruner import OUTCOMES, PruneSQL, prune
from tests.integration._workers import running_workers

from ._workflows import (
    WOKEN_WITHIN,
    Step,
    UniqueStep,
    claim_by_hand,
    complete_held,
    enqueue,
    outcome,
    rows,
    state,
    workflow_jobs,
)

LATER = timedelta(hours=1)


def test_a_child_of_unfinished_parents_waits_and_its_commit_marks_them(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    with Session(clean, expire_on_commit=False) as session:
        a = jobs.enqueue(session, Step(n=1), delay=LATER)
        b = jobs.enqueue(session, Step(n=2), delay=LATER)
        child = jobs.enqueue(session, Step(n=3), depends_on=[a, b.id, a])
        assert (child.state, child.waiting_on) == ("waiting", 2)
        session.commit()
    found = rows(clean, [a.id, b.id, child.id])
    assert found[child.id]["state"] == "waiting"
    assert found[child.id]["waiting_on"] == 2
    assert found[a.id]["has_dependents"]
    assert found[b.id]["has_dependents"]
    assert found[child.id]["has_dependents"] is None
    with clean.connect() as conn:
        edges = conn.execute(text("SELECT parent_id, child_id FROM sqla_jobs_dependency")).all()
    assert sorted(edges) == [(a.id, child.id), (b.id, child.id)]


def test_the_last_parents_completion_releases_the_child_and_records_the_outcome(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    a, b = enqueue(clean, jobs, 1, delay=LATER), enqueue(clean, jobs, 2, delay=LATER)
    child = enqueue(clean, jobs, 3, depends_on=[a, b])
    with clean.begin() as conn:
        assert complete_held(conn, a, claim_by_hand(conn, a)) == [a]
    assert rows(clean, [child])[child]["waiting_on"] == 1
    assert state(clean, child) == "waiting"
    with clean.begin() as conn:
        assert complete_held(conn, b, claim_by_hand(conn, b)) == [b]
    assert (state(clean, child), rows(clean, [child])[child]["waiting_on"]) == ("pending", 0)
    assert outcome(clean, a) == outcome(clean, b) == "completed"


def test_a_parent_completed_before_the_child_is_enqueued_counts_as_done(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    first = enqueue(clean, jobs, 2, depends_on=[parent])
    with clean.begin() as conn:
        complete_held(conn, parent, claim_by_hand(conn, parent))
    assert state(clean, first) == "pending"
    # The parent's row is gone; its recorded outcome accounts for it.
    with Session(clean, expire_on_commit=False) as session:
        late = jobs.enqueue(session, Step(n=3), depends_on=[parent])
        assert (late.state, late.waiting_on) == ("pending", None)
        session.commit()
    assert state(clean, late.id) == "pending"


def test_an_unknown_parent_raises_and_the_transaction_stays_usable(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1, delay=LATER)
    with Session(clean, expire_on_commit=False) as session:
        kept = jobs.enqueue(session, Step(n=2))
        with pytest.raises(DependencyError, match="999999999") as raised:
            jobs.enqueue(session, Step(n=3), depends_on=[parent, 999999999])
        assert raised.value.job_ids == [999999999]
        with pytest.raises(DependencyError):
            jobs.enqueue_many(session, [Step(n=4)], depends_on=[999999999])
        after = jobs.enqueue(session, Step(n=5), depends_on=[parent])
        session.commit()
    with clean.connect() as conn:
        payloads = conn.execute(text("SELECT payload->>'n' FROM sqla_jobs_job ORDER BY id"))
        assert [int(p) for (p,) in payloads] == [1, 2, 5]
    assert state(clean, kept.id) == "pending"
    assert state(clean, after.id) == "waiting"


def test_bad_depends_on_raises_before_any_sql(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    with Session(clean, expire_on_commit=False) as session:
        with pytest.raises(InvalidOptionError, match="list of jobs"):
            jobs.enqueue(session, Step(), depends_on=5)  # type: ignore[call-overload]
        with pytest.raises(InvalidOptionError, match="flush"):
            jobs.enqueue(session, Step(), depends_on=[True])
        with pytest.raises(InvalidOptionError, match="on_parent_failure"):
            jobs.enqueue(session, Step(), depends_on=[1], on_parent_failure="ignore")  # type: ignore[call-overload]
        assert session.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 0


def test_a_dead_parent_cancels_the_child_at_enqueue_with_the_reason(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    with clean.begin() as conn:
        conn.execute(
            text("UPDATE sqla_jobs_job SET state = 'dead', finished_at = now() WHERE id = :id"),
            {"id": parent},
        )
    with Session(clean, expire_on_commit=False) as session:
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent])
        assert child.state == "cancelled"
        assert child.last_error == f"parent job {parent} ended dead"
        session.commit()
    found = rows(clean, [child.id])[child.id]
    assert found["state"] == "cancelled"
    assert found["finished_at"] is not None
    assert found["errors"][-1]["error"] == "ParentFailed"
    assert str(parent) in found["errors"][-1]["message"]


def test_on_parent_failure_run_counts_a_dead_parent_as_done(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    dead, alive = enqueue(clean, jobs, 1), enqueue(clean, jobs, 2, delay=LATER)
    with clean.begin() as conn:
        conn.execute(
            text("UPDATE sqla_jobs_job SET state = 'dead', finished_at = now() WHERE id = :id"),
            {"id": dead},
        )
    anyway = enqueue(clean, jobs, 3, depends_on=[dead, alive], on_parent_failure="run")
    assert (state(clean, anyway), rows(clean, [anyway])[anyway]["waiting_on"]) == ("waiting", 1)
    with clean.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'cancelled', finished_at = now() WHERE id = :id"
            ),
            {"id": alive},
        )
    assert state(clean, anyway) == "pending"
    assert outcome(clean, alive) == "cancelled"


def test_enqueue_many_gives_every_job_the_same_parents(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1, delay=LATER)
    with Session(clean, expire_on_commit=False) as session:
        ids = jobs.enqueue_many(session, [Step(n=i) for i in range(100)], depends_on=[parent])
        session.commit()
    assert {r["state"] for r in rows(clean, ids).values()} == {"waiting"}
    with clean.begin() as conn:
        complete_held(conn, parent, claim_by_hand(conn, parent))
    assert {r["state"] for r in rows(clean, ids).values()} == {"pending"}


def test_the_async_enqueue_takes_depends_on(clean: Engine, migrated_url: str) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1, delay=LATER)

    async def go() -> tuple[int, list[int]]:
        engine = create_async_engine(sqlalchemy_url(migrated_url))
        try:
            async with AsyncSession(engine, expire_on_commit=False) as session:
                one = await jobs.enqueue_async(session, Step(n=2), depends_on=[parent])
                many = await jobs.enqueue_many_async(session, [Step(n=3)], depends_on=[parent])
                await session.commit()
                return one.id, list(many)
        finally:
            await engine.dispose()

    one, many = asyncio.run(go())
    assert {r["state"] for r in rows(clean, [one, *many]).values()} == {"waiting"}


def test_a_waiting_unique_job_holds_its_key_and_a_duplicate_keeps_its_parents(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    jobs.register("wf_unique", UniqueStep, unique=Unique(by=("n",)))
    first, second = enqueue(clean, jobs, 1, delay=LATER), enqueue(clean, jobs, 2, delay=LATER)
    with Session(clean, expire_on_commit=False) as session:
        held = jobs.enqueue(session, "wf_unique", {"n": 7}, depends_on=[first])
        again = jobs.enqueue(session, "wf_unique", {"n": 7}, depends_on=[second])
        assert again.id == held.id
        assert again.inserted is False
        session.commit()
    assert state(clean, held.id) == "waiting"
    with clean.connect() as conn:
        edges = conn.execute(
            text("SELECT parent_id FROM sqla_jobs_dependency WHERE child_id = :c"), {"c": held.id}
        ).all()
    assert edges == [(first,)]
    with clean.begin() as conn:
        complete_held(conn, first, claim_by_hand(conn, first))
    assert state(clean, held.id) == "pending"


def test_a_waiting_job_is_never_claimed_even_when_due(clean: Engine, migrated_url: str) -> None:
    jobs, runs = workflow_jobs()
    parent = enqueue(clean, jobs, 1, delay=LATER)
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    with clean.begin() as conn:  # due long ago, before anything else
        conn.execute(
            text("UPDATE sqla_jobs_job SET run_at = now() - interval '1 day' WHERE id = :id"),
            {"id": child},
        )
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        enqueue(clean, jobs, 3)
        assert runs.ran(3, WOKEN_WITHIN)
        assert state(clean, child) == "waiting"
    assert runs.order == [3]


def test_outcomes_are_pruned_with_the_retention_of_dead_jobs(
    clean: Engine, migrated_url: str
) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    enqueue(clean, jobs, 2, depends_on=[parent])
    with clean.begin() as conn:
        complete_held(conn, parent, claim_by_hand(conn, parent))
        conn.execute(text("UPDATE sqla_jobs_outcome SET finished_at = now() - interval '8 days'"))
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as conn:
        counts = prune(conn, PruneSQL(None), Retention().by_state())
    assert counts[OUTCOMES] == 1
    assert outcome(clean, parent) is None
    with Session(clean) as session, pytest.raises(DependencyError):
        jobs.enqueue(session, Step(n=3), depends_on=[parent])


def test_the_edges_of_a_child_gone_from_the_job_table_are_pruned(
    clean: Engine, migrated_url: str
) -> None:
    """Whatever the retention: once a child has left the job table (completed and deleted), its
    edges go at the pruner's next run; a waiting child's edges stay."""
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    other = enqueue(clean, jobs, 3, delay=LATER)
    waiting = enqueue(clean, jobs, 4, depends_on=[other])
    with clean.begin() as conn:
        complete_held(conn, parent, claim_by_hand(conn, parent))
    with clean.begin() as conn:
        complete_held(conn, child, claim_by_hand(conn, child))
    stmt = PruneSQL(None).prune_edges
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as conn:
        assert conn.execute(stmt.sql, stmt.params(limit=100)).rowcount == 1
    with clean.connect() as conn:
        left = conn.execute(text("SELECT parent_id, child_id FROM sqla_jobs_dependency")).all()
    assert [tuple(r) for r in left] == [(other, waiting)]


def test_a_released_child_keeps_its_own_delay_priority_and_concurrency_key(clean: Engine) -> None:
    """Release changes the state, nothing else: the child's own run_at (a delay counts from its
    enqueue), priority and concurrency key apply once it is pending."""
    jobs, _ = workflow_jobs()

    class Keyed(Step):
        pass

    @jobs.kind("wf_keyed", Keyed, concurrency_limit=1)
    def keyed(args: Keyed, ctx: JobContext) -> None:
        pass

    parent = enqueue(clean, jobs, 1)
    later = enqueue(clean, jobs, 2, depends_on=[parent], delay=LATER, priority=5)
    limited = enqueue(
        clean, jobs, 3, kind="wf_keyed", depends_on=[parent], priority=-3, concurrency_key="acct"
    )
    with clean.begin() as conn:
        complete_held(conn, parent, claim_by_hand(conn, parent))
        now = conn.execute(text("SELECT now()")).scalar_one()
    got = rows(clean, [later, limited])
    assert (got[later]["state"], got[later]["priority"]) == ("pending", 5)
    assert got[later]["run_at"] > now + LATER - timedelta(minutes=5), "its delay still counts"
    assert (got[limited]["state"], got[limited]["priority"]) == ("pending", -3)
    assert (got[limited]["concurrency_key"], got[limited]["concurrency_limit"]) == ("acct", 1)
