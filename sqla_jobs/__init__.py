"""sqla-jobs: a Postgres job queue in one table, as a SQLAlchemy 2.x ORM extension.

Enqueue rides the caller's own ``Session``: the job exists if and only if that transaction commits.
"""

from __future__ import annotations

from ._ops import CancelResult
from ._schedule_ops import ScheduleInfo
from .backoff import Backoff
from .context import Discard, JobContext, Snooze
from .errors import (
    ConfigurationError,
    DatabaseURLError,
    DuplicateJobError,
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
    JobReferencedError,
    JobStateError,
    LeaseLostError,
    OperationError,
    PayloadTooLargeError,
    RegistryError,
    ScheduleNotFoundError,
    SqlaJobsError,
    StepError,
    UniqueKeyTakenError,
    UnknownKindError,
)
from .hooks import EnqueueBatch, Hooks, OutcomeEvent
from .jobs import Jobs
from .kinds import Kind, KindOptions
from .links import link_table
from .model import Job, JobHistory, JobState, QueueState, metadata
from .retention import Retention
from .schedules import Periodic
from .unique import EnqueuedIds, OnConflict, Unique
from .worker import Worker

__all__ = [
    "Backoff",
    "CancelResult",
    "ConfigurationError",
    "DatabaseURLError",
    "Discard",
    "DuplicateJobError",
    "EnqueueBatch",
    "EnqueueError",
    "EnqueueHookError",
    "EnqueuedIds",
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
    "JobReferencedError",
    "JobState",
    "JobStateError",
    "Jobs",
    "Kind",
    "KindOptions",
    "LeaseLostError",
    "OnConflict",
    "OperationError",
    "OutcomeEvent",
    "PayloadTooLargeError",
    "Periodic",
    "QueueState",
    "RegistryError",
    "Retention",
    "ScheduleInfo",
    "ScheduleNotFoundError",
    "Snooze",
    "SqlaJobsError",
    "StepError",
    "Unique",
    "UniqueKeyTakenError",
    "UnknownKindError",
    "Worker",
    "link_table",
    "metadata",
]
