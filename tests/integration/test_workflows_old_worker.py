"""A worker of the release before job dependencies, in a rolling deploy: its claim (frozen here as
that release's golden SQL, ``frozen/claim_0007.sql``) takes only ``pending`` jobs, so it never
claims a waiting one, however long due."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import psycopg
from sqlalchemy import Engine, text

from sqla_jobs.db.urls import libpq_conninfo

from ._workflows import enqueue, state, workflow_jobs

OLD_CLAIM = (Path(__file__).parent / "frozen" / "claim_0007.sql").read_text()


def test_a_worker_before_job_dependencies_never_claims_a_waiting_job(
    clean: Engine, migrated_url: str
) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1, delay=timedelta(hours=1))
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    ready = enqueue(clean, jobs, 3)
    with clean.begin() as conn:  # the child due long ago, ahead of the ready job
        conn.execute(
            text("UPDATE sqla_jobs_job SET run_at = now() - interval '1 day' WHERE id = :id"),
            {"id": child},
        )
        queue = conn.execute(
            text("SELECT queue FROM sqla_jobs_job WHERE id = :id"), {"id": child}
        ).scalar_one()
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as conn:
        claimed = [
            row[0]
            for row in conn.execute(
                OLD_CLAIM,
                {
                    "attempts_1": 1,
                    "lease": timedelta(minutes=1),
                    "worker": "old",
                    "queue": queue,
                    "crashes_1": 0,
                    "crashed_ok": True,
                    "crashes_2": 1,
                    "last_life_ok": True,
                    "limit": 100,
                },
            )
        ]
    assert claimed == [ready]
    assert state(clean, child) == "waiting"
