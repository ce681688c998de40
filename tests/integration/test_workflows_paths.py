"""The ends of a parent that the worker tests do not reach in a few seconds, each through the
worker's own statement on a job claimed by hand: the reap of a crash budget spent (dead), the
``completed`` row kept for an application's foreign key, and a run cancelled by an operator."""

from __future__ import annotations

from sqlalchemy import Engine, text

from sqla_jobs.sql import leases as leases_sql
from sqla_jobs.sql import outcomes as outcomes_sql
from sqla_jobs.sql.compiled import compile_statement

from ._workflows import claim_by_hand, enqueue, outcome, rows, state, workflow_jobs


def test_a_reap_at_max_crashes_cancels_the_children(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    with clean.begin() as conn:
        claim_by_hand(conn, parent)
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET max_crashes = 1,"
                " lease_expires_at = now() - interval '1 minute' WHERE id = :id"
            ),
            {"id": parent},
        )
        reaped = conn.execute(leases_sql.reap(), {"limit": 10}).all()
    assert [(r.id, r.state) for r in reaped] == [(parent, "dead")]
    assert state(clean, child) == "cancelled"
    assert rows(clean, [child])[child]["last_error"] == f"parent job {parent} ended dead"


def test_a_reap_with_budget_left_changes_nothing_for_the_children(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    with clean.begin() as conn:
        claim_by_hand(conn, parent)
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET lease_expires_at = now() - interval '1 minute'"
                " WHERE id = :id"
            ),
            {"id": parent},
        )
        conn.execute(leases_sql.reap(), {"limit": 10})
    assert state(clean, parent) == "pending"
    assert state(clean, child) == "waiting"
    assert outcome(clean, parent) is None


def test_a_completed_row_kept_for_a_foreign_key_releases_the_children(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    with clean.begin() as conn:
        token = claim_by_hand(conn, parent)
        kept = conn.execute(
            outcomes_sql.keep_completed_in_session(),
            {"job_id": parent, "token": token, "error": "referenced"},
        ).all()
    assert kept == [(parent,)]
    assert state(clean, parent) == "completed"
    assert state(clean, child) == "pending"
    assert outcome(clean, parent) == "completed"


def test_a_run_cancelled_by_an_operator_cancels_the_children(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    with clean.begin() as conn:
        token = claim_by_hand(conn, parent)
        stmt = compile_statement(outcomes_sql.finish_cancelled(), None)
        conn.exec_driver_sql(stmt.sql, stmt.params(id=parent, token=token, error="stopped"))
    assert state(clean, child) == "cancelled"
    assert outcome(clean, parent) == "cancelled"
