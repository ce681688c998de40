"""The tables, as SQLAlchemy models, on the package's own ``MetaData``: :mod:`.names` (names,
states, channels), :mod:`.job` (the queue table and history), :mod:`.limits` (the rate
limiters), :mod:`.tables` (the rest), :mod:`.workflows` (job dependencies).

Every object the package creates starts with ``sqla_jobs``, so one grep finds them all and nothing
collides with the application's tables. The tables carry no schema: the schema is chosen at run time
(``Jobs(schema=...)``, through SQLAlchemy's ``schema_translate_map``) and in migrations
(``-x sqla_jobs_schema=...``), so the default is the connection's ``search_path``.
"""

from sqla_jobs.model.job import JOB_TABLE_STORAGE, Job, JobHistory
from sqla_jobs.model.limits import RateLimiter
from sqla_jobs.model.names import (
    ALWAYS_UNIQUE_STATES,
    DEPENDENCY_TABLE,
    ENQUEUED,
    HELD_UNIQUE_STATES,
    HISTORY_TABLE,
    JOB_TABLE,
    MAX_ERROR_CHARS,
    OUTCOME_TABLE,
    PREFIX,
    QUEUE_TABLE,
    RATE_LIMITER_TABLE,
    SCHEDULE_TABLE,
    STATES,
    THROUGHPUT_TABLE,
    UNIQUE_PREDICATE,
    VERSION_TABLE,
    WORKER_TABLE,
    Base,
    JobState,
    cancel_channel,
    metadata,
    notify_channel,
)
from sqla_jobs.model.tables import QueueState, RegisteredWorker, Schedule, ThroughputMinute
from sqla_jobs.model.workflows import Dependency, JobOutcome, workflow_ddl

__all__ = [
    "ALWAYS_UNIQUE_STATES",
    "DEPENDENCY_TABLE",
    "ENQUEUED",
    "HELD_UNIQUE_STATES",
    "HISTORY_TABLE",
    "JOB_TABLE",
    "JOB_TABLE_STORAGE",
    "MAX_ERROR_CHARS",
    "OUTCOME_TABLE",
    "PREFIX",
    "QUEUE_TABLE",
    "RATE_LIMITER_TABLE",
    "SCHEDULE_TABLE",
    "STATES",
    "THROUGHPUT_TABLE",
    "UNIQUE_PREDICATE",
    "VERSION_TABLE",
    "WORKER_TABLE",
    "Base",
    "Dependency",
    "Job",
    "JobHistory",
    "JobOutcome",
    "JobState",
    "QueueState",
    "RateLimiter",
    "RegisteredWorker",
    "Schedule",
    "ThroughputMinute",
    "cancel_channel",
    "metadata",
    "notify_channel",
    "workflow_ddl",
]
