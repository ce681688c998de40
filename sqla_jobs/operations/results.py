"""Reading a job's stored result (``jobs.result``): what the handler of a kind with
``results=True`` returned, kept with the job's outcome until the retention of dead jobs prunes it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from sqla_jobs.errors import NoResultError
from sqla_jobs.operations.jobs import Scope
from sqla_jobs.sql import results as results_sql

_JOB_RESULT = results_sql.job_result()


def result(session: Session, scope: Scope, job_id: int) -> Any:
    """The stored result of job ``job_id`` as the caller's transaction sees it, in JSON form;
    :class:`~sqla_jobs.NoResultError` if there is none."""
    row = session.execute(_JOB_RESULT, {"job_id": job_id}, execution_options=scope.options).first()
    if row is None or not row.stored:
        raise NoResultError(
            f"job {job_id} has no stored result: it has not completed, its kind does not store "
            "results (results=True), or its outcome was pruned",
            job_id,
        )
    return row[0]
