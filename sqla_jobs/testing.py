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
from sqlalchemy import select
from sqlalchemy.orm import Session

from ._sql import Compiled, WorkerSQL
from .context import ClaimedJob, JobContext
from .jobs import Jobs
from .kinds import load_payload
from .model import Job, JobState


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


@dataclass
class RunResult:
    """What :func:`run_jobs` did."""

    done: int = 0
    failed: int = 0
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

    Completion and failure are written through ``session`` (the caller's transaction), exactly as
    a worker would write them. With ``raise_errors`` the first handler exception is re-raised after
    its failure is recorded; otherwise errors are collected in the result.
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
            job = ClaimedJob(*row)
            kind = jobs.get(job.kind)
            if kind is None or kind.handler is None:
                raise LookupError(f"no handler registered for kind {job.kind!r}")
            ctx = JobContext.for_job(job, "testing", record)
            try:
                value: Any = kind.handler(load_payload(kind.model, row.payload), ctx)
                if inspect.isawaitable(value):
                    asyncio.run(_await(value))
            except Exception as exc:
                execute(
                    sql.fail,
                    id=row.id,
                    token=row.lease_token,
                    error=f"{type(exc).__name__}: {exc}",
                    force_dead=False,
                    **kind.options.backoff.sql_params(),
                )
                result.failed += 1
                result.errors.append(exc)
                if raise_errors:
                    raise
            else:
                execute(sql.complete, ids=[row.id], tokens=[row.lease_token])
                result.done += 1
    return result


async def _await(value: Any) -> Any:
    return await value
