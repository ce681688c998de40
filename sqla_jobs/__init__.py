"""sqla-jobs: a Postgres job queue in one table, as a SQLAlchemy 2.x ORM extension.

Enqueue rides the caller's own ``Session``: the job exists if and only if that transaction commits.
"""

from __future__ import annotations

from ._ops import CancelResult
from .backoff import Backoff
from .context import Discard, JobContext, Snooze
from .errors import (
    ConfigurationError,
    DatabaseURLError,
    EnqueueError,
    EnqueueHookError,
    InvalidMetaError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidQueueNameError,
    InvalidScheduleError,
    InvalidTextError,
    JobCancelledError,
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
    OperationError,
    PayloadTooLargeError,
    RegistryError,
    SqlaJobsError,
    StepError,
    UnknownKindError,
)
from .hooks import EnqueueBatch, Hooks, OutcomeEvent
from .jobs import Jobs
from .kinds import Kind, KindOptions
from .model import Job, JobHistory, JobState, QueueState, metadata
from .retention import Retention
from .worker import Worker

__all__ = [
    "Backoff",
    "CancelResult",
    "ConfigurationError",
    "DatabaseURLError",
    "Discard",
    "EnqueueBatch",
    "EnqueueError",
    "EnqueueHookError",
    "Hooks",
    "InvalidMetaError",
    "InvalidOptionError",
    "InvalidPayloadError",
    "InvalidQueueNameError",
    "InvalidScheduleError",
    "InvalidTextError",
    "Job",
    "JobCancelledError",
    "JobContext",
    "JobHistory",
    "JobNotFoundError",
    "JobState",
    "JobStateError",
    "Jobs",
    "Kind",
    "KindOptions",
    "LeaseLostError",
    "OperationError",
    "OutcomeEvent",
    "PayloadTooLargeError",
    "QueueState",
    "RegistryError",
    "Retention",
    "Snooze",
    "SqlaJobsError",
    "StepError",
    "UnknownKindError",
    "Worker",
    "metadata",
]
