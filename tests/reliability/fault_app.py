"""The application of the worker-fault scenarios (``test_worker_faults.py``), run in real worker
processes: ``python -m sqla_jobs.cli worker tests.reliability.fault_app:jobs``.

Handlers record each run in ``chaos_effects`` as the chaos app's do (one row per run, committed
before the handler returns); the overrunning handler also records when each run started and ended,
by the database's clock, in ``fault_runs``.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel
from sqlalchemy import Engine, text

from sqla_jobs import Backoff, JobContext, Jobs
from tests.reliability.chaos_app import _connection, _write, record_run, reset_tables, wait_for_gate

TARGET = "tests.reliability.fault_app:jobs"

jobs = Jobs()

#: The overrunning kind's timeout (seconds). A kind option, so fixed here: the worker processes do
#: not see the test's SQLA_JOBS_CHAOS scale.
OVERRUN_TIMEOUT = 1.0

TABLES_DDL = (
    "CREATE TABLE IF NOT EXISTS fault_runs ("
    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint NOT NULL,"
    " attempt int NOT NULL, pid int NOT NULL, key text NOT NULL,"
    " started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)",
)


class Sleep(BaseModel):
    """Work for ``ms`` milliseconds, then record the run."""

    ms: int = 0


class Refuse(BaseModel):
    """Record the run, then fail (raise)."""


class Hold(BaseModel):
    """Wait until the test opens ``gate`` (``chaos_app.open_gate``), then record the run."""

    gate: str


class Overrun(BaseModel):
    """Record the run's start, sleep ``ms`` ignoring the kind's timeout, record its end."""

    key: str
    ms: int


@jobs.kind("fault_sleep", Sleep)
def sleep(args: Sleep, ctx: JobContext) -> None:
    time.sleep(args.ms / 1000)
    record_run(ctx)


@jobs.kind("fault_refuse", Refuse, max_attempts=1)
def refuse(args: Refuse, ctx: JobContext) -> None:
    record_run(ctx)
    raise RuntimeError("refused on purpose")


@jobs.kind("fault_hold", Hold)
def hold(args: Hold, ctx: JobContext) -> None:
    wait_for_gate(args.gate)
    record_run(ctx)


@jobs.kind(
    "fault_overrun",
    Overrun,
    concurrency_key=lambda p: p.key,
    concurrency_limit=1,
    timeout=OVERRUN_TIMEOUT,
    max_attempts=2,
    # Retried at once: a retry that could overlap its previous run does so right away.
    backoff=Backoff(cap_seconds=0),
)
def overrun(args: Overrun, ctx: JobContext) -> None:
    row = (
        _connection()
        .execute(
            "INSERT INTO fault_runs (job_id, attempt, pid, key) VALUES (%s, %s, %s, %s) "
            "RETURNING seq",
            (ctx.job_id, ctx.attempt, os.getpid(), args.key),
        )
        .fetchone()
    )
    assert row is not None
    time.sleep(args.ms / 1000)  # a sync handler that ignores its timeout
    _write("UPDATE fault_runs SET ended_at = clock_timestamp() WHERE seq = %s", (row[0],))


# -- the test side -------------------------------------------------------------------------------


def reset_fault_tables(engine: Engine) -> None:
    """The chaos app's tables (emptied, with the queue's) and this app's, emptied."""
    reset_tables(engine)
    with engine.begin() as conn:
        for ddl in TABLES_DDL:
            conn.execute(text(ddl))
        conn.execute(text("TRUNCATE fault_runs"))


def lapse_witness(engine: Engine, seconds: float) -> int:
    """A ``fault_sleep`` job leased ``seconds`` from now to a worker that never renews it; its id.

    A reaper returns it to the queue once its lease has expired, so when it shows ``crashes = 1``
    a reap ran after that moment: a condition to wait on instead of sleeping past it.
    """
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO sqla_jobs_job (kind, payload, state, attempts, lease_token, "
                    " lease_expires_at, locked_by) VALUES ('fault_sleep', '{\"ms\": 0}', "
                    " 'running', 1, gen_random_uuid(), now() + make_interval(secs => :s), "
                    " 'lapse-witness:0:never')"
                    " RETURNING id"
                ),
                {"s": seconds},
            ).scalar_one()
        )


def reaped(engine: Engine, job_id: int) -> bool:
    """Whether a reaper has returned the lapse witness ``job_id`` (or it ran since)."""
    with engine.connect() as conn:
        crashes = conn.execute(
            text("SELECT crashes FROM sqla_jobs_job WHERE id = :id"), {"id": job_id}
        ).scalar()
    return crashes is None or int(crashes) >= 1
