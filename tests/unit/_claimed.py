"""A claimed job as the worker holds it, built by hand for the tests that need no database."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from sqla_jobs.context import ClaimedJob


def claimed_job(
    job_id: int = 1,
    *,
    kind: str = "k",
    payload: str = "{}",
    attempts: int | None = None,
    max_attempts: int = 10,
    crashes: int = 0,
    max_crashes: int = 3,
    token: uuid.UUID | None = None,
) -> ClaimedJob:
    """A job claimed under a fresh lease (``attempts`` defaults to one more than ``crashes``)."""
    return ClaimedJob(
        id=job_id,
        queue="default",
        kind=kind,
        payload=payload,
        priority=0,
        attempts=crashes + 1 if attempts is None else attempts,
        max_attempts=max_attempts,
        crashes=crashes,
        max_crashes=max_crashes,
        interruptions=0,
        lease_token=token or uuid.uuid4(),
        created_us=int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()) * 1_000_000,
        concurrency_key=None,
        steps=None,
    )
