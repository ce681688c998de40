"""Helpers for your own tests: see what a code path enqueued, and run jobs inline.

Both work inside the test's transaction (including one that is rolled back at the end), because
they use the test's own ``Session``:

.. code-block:: python

    def test_checkout_sends_the_invoice(session):
        checkout(session, cart)
        [job] = testing.enqueued(session, SendInvoice)
        assert job.payload == {"invoice_id": cart.invoice_id}
        result = testing.run_jobs(jobs, session)
        assert result.done == 1
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from ._config import WorkerSeams
from ._outcome import Outcome, failed, resolve, snoozed
from ._sql import Compiled, WorkerSQL
from ._writes import outcome_statement
from .context import ClaimedJob, JobContext, Recorder, Snooze
from .jobs import Jobs
from .model import Job, JobState

__all__ = ["JobFailed", "RunResult", "WorkerSeams", "enqueued", "run_jobs"]


def enqueued(
    session: Session, kind: type[BaseModel] | str | None = None, *, jobs: Jobs | None = None
) -> list[Job]:
    """The pending jobs visible to ``session`` (its own uncommitted ones included), oldest first,
    optionally of one kind (a kind string, or a payload model registered with ``jobs``)."""
    stmt = select(Job).where(Job.state == JobState.PENDING.value).order_by(Job.id)
    if isinstance(kind, str):
        stmt = stmt.where(Job.kind == kind)
    elif kind is not None:
        if jobs is None:
            raise TypeError("pass jobs= to look a payload model up by its kind")
        stmt = stmt.where(Job.kind == jobs.by_model(kind).name)
    opts = (
        {} if jobs is None or jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}
    )
    session.flush()
    return list(session.scalars(stmt, execution_options=opts))


class JobFailed(Exception):
    """A job :func:`run_jobs` ran did not complete, for a reason other than its handler's own
    exception (an unknown kind, a payload that no longer validates): the outcome's error."""


@dataclass
class RunResult:
    """What :func:`run_jobs` did."""

    done: int = 0
    failed: int = 0
    dead: int = 0
    snoozed: int = 0
    errors: list[BaseException] = field(default_factory=list)


def run_jobs(
    jobs: Jobs,
    session: Session,
    *,
    queues: list[str] | None = None,
    limit: int = 1000,
    raise_errors: bool = True,
) -> RunResult:
    """Claim the due jobs visible to ``session`` and run their handlers inline, in this thread.

    Outcomes follow the worker's own rules (:mod:`sqla_jobs._outcome`): an unknown kind is a
    failure with backoff, a payload that no longer validates is dead, a handler's exception is a
    failure with the kind's backoff. They are written through ``session`` (the caller's
    transaction) with the worker's statements. With ``raise_errors`` the first error is re-raised
    after its outcome is recorded (a handler's own exception, or :class:`JobFailed`); otherwise
    errors are collected in the result.
    """
    result = RunResult()
    sql = WorkerSQL(jobs.schema)
    session.flush()
    # The worker's own compiled statements, on the session's connection and transaction.
    conn = session.connection()

    def execute(stmt: Compiled, **params: Any) -> Any:
        return conn.exec_driver_sql(stmt.sql, stmt.params(**params))

    def record(job_id: int, token: uuid.UUID, name: str, value: str) -> bool:
        return (
            execute(sql.record_step, id=job_id, token=token, name=name, value=value).first()
            is not None
        )

    lease = timedelta(minutes=5)
    for queue in queues or sorted({k.options.queue for k in jobs}):
        rows = execute(sql.claim, queue=queue, limit=limit, lease=lease, worker="testing").all()
        # Keyed jobs too, within their limits, as a worker would claim them.
        keys = [r[0] for r in execute(sql.lock_keys, queue=queue, scan=limit).all()]
        if keys:
            rows += execute(
                sql.claim_keyed, queue=queue, keys=keys, limit=limit, lease=lease, worker="testing"
            ).all()
        for row in rows:
            error = _run_one(jobs, ClaimedJob(*row), record, conn, sql, result)
            if error is not None:
                result.errors.append(error)
                if raise_errors:
                    raise error
    return result


def _run_one(
    jobs: Jobs,
    job: ClaimedJob,
    record: Recorder,
    conn: Connection,
    sql: WorkerSQL,
    result: RunResult,
) -> BaseException | None:
    """Run one claimed job and write its outcome; the error to report, if it did not complete."""
    resolved = resolve(jobs, job)
    error: BaseException | None = None
    if isinstance(resolved, Outcome):
        outcome = resolved
        error = JobFailed(f"job {job.id} ({job.kind}): {outcome.error}")
    else:
        kind, args = resolved
        ctx = JobContext.for_job(job, "testing", record)
        try:
            value: Any = kind.handler(args, ctx)  # type: ignore[misc]
            if inspect.isawaitable(value):
                asyncio.run(_await(value))
            outcome = Outcome(job)
        except Snooze as exc:
            outcome = snoozed(job, exc)
        except Exception as exc:
            outcome, error = failed(job, kind, exc), exc
    if outcome.error is None and outcome.snooze_us is None:
        conn.exec_driver_sql(
            sql.complete.sql, sql.complete.params(ids=[job.id], token=job.lease_token)
        )
        result.done += 1
        return None
    statement, params = outcome_statement(sql, outcome)
    state = conn.exec_driver_sql(statement, params).first()
    if outcome.snooze_us is not None:
        result.snoozed += 1
    elif state is not None and state[0] == JobState.DEAD.value:
        result.dead += 1
    else:
        result.failed += 1
    return error


async def _await(value: Any) -> Any:
    return await value
