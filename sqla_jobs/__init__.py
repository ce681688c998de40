"""sqla-jobs: a Postgres job queue in one table, as a SQLAlchemy 2.x ORM extension.

Enqueue rides the caller's own ``Session``: the job exists if and only if that transaction commits.
"""

from __future__ import annotations

from .backoff import Backoff
from .context import JobContext
from .errors import (
    ConfigurationError,
    DatabaseURLError,
    EnqueueError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidQueueNameError,
    InvalidScheduleError,
    InvalidTextError,
    LeaseLostError,
    PayloadTooLargeError,
    RegistryError,
    SqlaJobsError,
    StepError,
    UnknownKindError,
)
from .jobs import Jobs
from .kinds import Kind, KindOptions
from .model import Job, JobHistory, JobState, metadata
from .worker import Worker

__all__ = [
    "Backoff",
    "ConfigurationError",
    "DatabaseURLError",
    "EnqueueError",
    "InvalidOptionError",
    "InvalidPayloadError",
    "InvalidQueueNameError",
    "InvalidScheduleError",
    "InvalidTextError",
    "Job",
    "JobContext",
    "JobHistory",
    "JobState",
    "Jobs",
    "Kind",
    "KindOptions",
    "LeaseLostError",
    "PayloadTooLargeError",
    "RegistryError",
    "SqlaJobsError",
    "StepError",
    "UnknownKindError",
    "Worker",
    "metadata",
]
