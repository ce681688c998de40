"""The sampler's count of the jobs waiting on their parents: an estimate from the planner's
statistics of the job table, read from the catalog whatever the size of the waiting backlog (no
index holds the waiting jobs: a count would read every one of them at every sample)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, text

from sqla_jobs.observe.metrics import Metrics
from sqla_jobs.sql import metrics as metrics_sql
from tests._waiting import wait_until
from tests.integration._workers import running_workers
from tests.integration.test_metrics import fast, make_jobs, quiet, scrape, value

__all__ = ["quiet"]  # the fixture, imported for pytest


def _plant(engine: Engine, waiting: int, pending: int) -> None:
    """``waiting`` jobs waiting on one parent each and ``pending`` due ones, then ANALYZE."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload, state, waiting_on) "
                "SELECT 'q' || (i % 3), 'k', '{}', 'waiting', 1 FROM generate_series(1, :n) i"
            ),
            {"n": waiting},
        )
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload, run_at) "
                "SELECT 'q' || (i % 3), 'k', '{}', now() + interval '1 hour' "
                "FROM generate_series(1, :n) i"
            ),
            {"n": pending},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE sqla_jobs_job"))


def _relations(node: dict[str, Any]) -> list[str]:
    found = [node["Relation Name"]] if "Relation Name" in node else []
    for child in node.get("Plans", []):
        found += _relations(child)
    return found


def test_the_waiting_estimate_reads_the_catalog_not_the_waiting_jobs(quiet: Engine) -> None:
    with quiet.connect() as conn:
        params = {"job_table": "sqla_jobs_job"}
        before = conn.execute(metrics_sql.estimate_waiting(), params).scalar_one()
    _plant(quiet, waiting=20_000, pending=5_000)
    with quiet.connect() as conn:
        estimate = conn.execute(metrics_sql.estimate_waiting(), params).scalar_one()
        sql = str(metrics_sql.estimate_waiting().compile(dialect=quiet.dialect))
        explain = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        (plan,) = explain.scalar_one()
    assert before == 0
    assert 19_000 <= estimate <= 21_000
    relations = _relations(plan["Plan"])
    assert "pg_class" in relations, json.dumps(plan)[:3000]
    assert "sqla_jobs_job" not in relations, json.dumps(plan)[:3000]


def test_the_elected_samplers_gauge_shows_the_waiting_jobs(
    quiet: Engine, migrated_url: str
) -> None:
    _plant(quiet, waiting=300, pending=0)
    jobs, _ = make_jobs()
    metrics = Metrics(port=0, sample_interval=0.1)
    with running_workers(jobs, migrated_url, **fast(metrics)):
        estimate = wait_until(
            lambda: value(scrape(metrics), "sqla_jobs_waiting_jobs_estimate"),
            what="the sampler estimates the waiting jobs",
        )
    assert estimate == 300
