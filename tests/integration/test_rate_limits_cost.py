"""What rate limits cost the rest: the plain claim never reads a due job a limit holds (they are
outside its index), and the queue sample counts the held jobs from their own index."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_jobs import Jobs, RateLimit
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql import metrics as metrics_sql
from sqla_jobs.sql.compiled import WorkerSQL, compile_statement


class Call(BaseModel):
    n: int


class Free(BaseModel):
    n: int


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


def test_the_plain_claim_reads_no_job_a_rate_limit_holds(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()
    jobs.register("limited", Call, rate_limit=RateLimit(1, per=timedelta(minutes=10)))
    jobs.register("free", Free)
    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Call(n=i) for i in range(3000)])
        jobs.enqueue_many(s, [Free(n=i) for i in range(5)])
    claim = WorkerSQL(None).claim
    params = claim.params(queue="default", limit=10, lease=timedelta(minutes=1), worker="w")
    with psycopg.connect(libpq_conninfo(migrated_url)) as conn:
        conn.execute("ANALYZE sqla_jobs_job")
        row = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim.sql}", params
        ).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    nodes = _nodes(plan[0]["Plan"])
    scans = [
        n
        for n in nodes
        if n.get("Relation Name") == "sqla_jobs_job" and n["Node Type"] != "ModifyTable"
    ]
    assert {n["Node Type"] for n in scans} <= {"Index Scan", "Index Only Scan"}
    # Every read of the pending jobs goes through the claim index, which holds none of the 3,000
    # limited jobs; the rest are primary-key fetches of the five it claims.
    assert {n.get("Index Name") for n in scans} <= {"sqla_jobs_job_claim_idx", "sqla_jobs_job_pkey"}
    assert plan[0]["Plan"]["Actual Rows"] == 5
    assert all(n.get("Rows Removed by Filter", 0) == 0 for n in scans)


def test_the_sample_counts_due_jobs_held_by_a_limit(clean: Engine, migrated_url: str) -> None:
    jobs = Jobs()
    jobs.register("limited", Call, rate_limit=RateLimit(1, per=timedelta(minutes=10)))
    jobs.register("free", Free)
    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Call(n=i) for i in range(4)])
        jobs.enqueue(s, Call(n=9), delay=timedelta(hours=1))
        jobs.enqueue_many(s, [Free(n=i) for i in range(2)])
    sample = compile_statement(metrics_sql.sample_queues(), None)
    scheduled = compile_statement(metrics_sql.count_scheduled(), None)
    with psycopg.connect(libpq_conninfo(migrated_url)) as conn:
        rows = conn.execute(sample.sql, sample.params()).fetchall()
        later = conn.execute(scheduled.sql, scheduled.params()).fetchall()
    counts: dict[str, int] = {}
    for _, state, n, _ in [*rows, *later]:
        counts[state] = counts.get(state, 0) + int(n)
    assert counts == {"due": 6, "rate_limited": 4, "scheduled": 1}
