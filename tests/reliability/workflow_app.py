"""The application of the workflow kill scenario
(``python -m sqla_jobs.cli worker tests.reliability.workflow_app:jobs``).

Every node of a graph is a ``step`` job whose handler takes the worker's Session: it records its
run (job id, graph, node, start and end by the database clock) in that Session, then works for
``ms`` milliseconds, so the record commits with the job's completion (and the release of its
children), or not at all when a kill cuts the run off.
"""

from __future__ import annotations

import time

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs

TARGET = "tests.reliability.workflow_app:jobs"
#: Kills may hit a job several times; it must never go dead for it here.
MAX_CRASHES = 50

jobs = Jobs()

RUNS_DDL = (
    "DROP TABLE IF EXISTS wf_runs",
    "CREATE TABLE wf_runs (job_id bigint NOT NULL, graph int NOT NULL, node text NOT NULL, "
    "started timestamptz NOT NULL, ended timestamptz NOT NULL)",
)


class Step(BaseModel):
    """One node of graph ``graph``: record the run, then work for ``ms`` milliseconds."""

    graph: int
    node: str
    ms: int = 0


class Doomed(BaseModel):
    """A node that always fails: dead at its first failure, so its dependents are cancelled."""

    graph: int


@jobs.kind("doomed", Doomed, max_attempts=1, max_crashes=MAX_CRASHES)
def doomed(args: Doomed, ctx: JobContext) -> None:
    raise RuntimeError(f"graph {args.graph}: this node always fails")


@jobs.kind("step", Step, max_crashes=MAX_CRASHES)
def step(args: Step, ctx: JobContext, session: Session) -> None:
    started = session.execute(text("SELECT clock_timestamp()")).scalar_one()
    time.sleep(args.ms / 1000)
    session.execute(
        text("INSERT INTO wf_runs VALUES (:job_id, :graph, :node, :started, clock_timestamp())"),
        {"job_id": ctx.job_id, "graph": args.graph, "node": args.node, "started": started},
    )
