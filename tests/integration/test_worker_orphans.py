"""A worker back from a lost connection gives back, without charge, the jobs the table says it runs
under leases it no longer holds: what a failover that lost commits leaves behind (asynchronous
replication: a completion committed on the old primary only). Played here on one server: a row set
``running`` under the worker's name and a lease it never had, then the worker's claim connections
ended, as a failover ends them. The failover harness plays it with a real standby
(``tests/reliability/test_failover.py``, the asynchronous scenario)."""

from __future__ import annotations

import threading
import uuid

import psycopg
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs
from sqla_jobs.db.urls import libpq_conninfo
from tests._waiting import DEADLINE, wait_until
from tests.integration._workers import running_workers

QUEUE = "orphans"


class Probe(BaseModel):
    n: int


def orphan(engine: Engine, job_id: int, worker: str) -> None:
    """Make job ``job_id`` look as a lost completion leaves it on the new primary: running under
    ``worker``'s name, a lease of an hour the worker does not hold, its attempt charged."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'running', locked_by = :worker,"
                " lease_token = :token, lease_expires_at = now() + interval '1 hour',"
                " attempts = attempts + 1 WHERE id = :id"
            ),
            {"worker": worker, "token": uuid.uuid4(), "id": job_id},
        )


def end_claim_connections(url: str, worker: str) -> int:
    """End the worker's claim connections (their sessions killed, as a failover does)."""
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
            (f"sqla-jobs claim% {worker}"[:63],),
        ).fetchall()
    return len(rows)


def test_a_worker_back_from_an_outage_gives_back_its_orphans_without_charge(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    runs: list[tuple[int, int, int]] = []
    ran = threading.Event()

    @jobs.kind("orphan_probe", Probe, queue=QUEUE)
    def probe(p: Probe, ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.attempt, ctx.crashes))
        ran.set()

    with Session(clean) as s, s.begin():
        job_id = jobs.enqueue(s, Probe(n=1)).id
    # A held lease of the same worker, and a running job of another worker: neither is touched.
    with running_workers(jobs, migrated_url, queues=["elsewhere"], poll_interval=0.1) as (w,):
        orphan(clean, job_id, w.name)
        with clean.begin() as conn:
            other = conn.execute(
                text(
                    "INSERT INTO sqla_jobs_job (queue, kind, payload, state, locked_by,"
                    " lease_token, lease_expires_at, attempts)"
                    " VALUES (:q, 'orphan_probe', '{\"n\": 2}', 'running', 'another-worker',"
                    " gen_random_uuid(), now() + interval '1 hour', 1) RETURNING id"
                ),
                {"q": QUEUE},
            ).scalar_one()
        assert end_claim_connections(migrated_url, w.name) >= 1

        def given_back() -> bool:
            with clean.connect() as conn:
                state = conn.execute(
                    text("SELECT state FROM sqla_jobs_job WHERE id = :id"), {"id": job_id}
                ).scalar_one()
            return state == "pending"

        # Its connection is found lost at the next poll; the lease would last an hour.
        wait_until(given_back, what="the orphan given back after the reconnect")
    with clean.connect() as conn:
        row = conn.execute(
            text(
                "SELECT attempts, crashes, interruptions, lease_token IS NULL, locked_by"
                " FROM sqla_jobs_job WHERE id = :id"
            ),
            {"id": job_id},
        ).one()
        kept = conn.execute(
            text("SELECT state, locked_by FROM sqla_jobs_job WHERE id = :id"), {"id": other}
        ).one()
    assert tuple(row) == (0, 0, 1, True, None)
    assert tuple(kept) == ("running", "another-worker")
    # Claimed again and run, charged nothing for the lost end.
    with running_workers(jobs, migrated_url, queues=[QUEUE], poll_interval=0.1):
        assert ran.wait(DEADLINE)
    assert runs == [(job_id, 1, 0)]
