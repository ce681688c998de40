"""sqla-jobs: a Postgres job queue in one table, as a SQLAlchemy 2.x ORM extension.

Enqueue rides the caller's own ``Session``: the job exists if and only if that transaction commits.
"""

from __future__ import annotations

from sqla_jobs.backoff import Backoff
from sqla_jobs.context import Discard, JobContext, Snooze
from sqla_jobs.db.failover import failover_safe
from sqla_jobs.errors import (
    ConfigurationError,
    DatabaseURLError,
    DependencyError,
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
    NoResultError,
    NotMigratedError,
    OperationError,
    PayloadTooLargeError,
    QueueInUseError,
    RegistryError,
    ResultError,
    ScheduleNotFoundError,
    SqlaJobsError,
    StepError,
    UniqueKeyTakenError,
    UnknownKindError,
    UnknownQueueError,
)
from sqla_jobs.hooks import EnqueueBatch, Hooks, OutcomeEvent
from sqla_jobs.jobs import Jobs
from sqla_jobs.kinds import Kind, KindOptions
from sqla_jobs.links import link_table
from sqla_jobs.model import Job, JobHistory, JobState, QueueState, metadata
from sqla_jobs.operations.jobs import CancelResult
from sqla_jobs.operations.queues import QueueChange
from sqla_jobs.periodic.ops import ScheduleInfo
from sqla_jobs.periodic.schedule import Periodic
from sqla_jobs.rate_limit import RateLimit
from sqla_jobs.retention import Retention
from sqla_jobs.unique import EnqueuedIds, OnConflict, Unique
from sqla_jobs.worker.facade import Worker

__all__ = [
    "Backoff",
    "CancelResult",
    "ConfigurationError",
    "DatabaseURLError",
    "DependencyError",
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
    "NoResultError",
    "NotMigratedError",
    "OnConflict",
    "OperationError",
    "OutcomeEvent",
    "PayloadTooLargeError",
    "Periodic",
    "QueueChange",
    "QueueInUseError",
    "QueueState",
    "RateLimit",
    "RegistryError",
    "ResultError",
    "Retention",
    "ScheduleInfo",
    "ScheduleNotFoundError",
    "Snooze",
    "SqlaJobsError",
    "StepError",
    "Unique",
    "UniqueKeyTakenError",
    "UnknownKindError",
    "UnknownQueueError",
    "Worker",
    "failover_safe",
    "link_table",
    "metadata",
]
