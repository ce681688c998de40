"""One exception hierarchy, rooted at :class:`SqlaJobsError`.

Every message names the thing that was wrong and what to do about it.
"""

from __future__ import annotations


class SqlaJobsError(Exception):
    """Base class of every error raised by sqla-jobs."""


class ConfigurationError(SqlaJobsError):
    """A setting cannot work (for example a lease shorter than the kind's timeout)."""


class RegistryError(SqlaJobsError):
    """A kind was registered twice, or a registration is malformed."""


class EnqueueError(SqlaJobsError):
    """Base class of the errors :meth:`Jobs.enqueue` raises before any SQL runs.

    When one of these is raised nothing was written and the caller's transaction is still usable.
    """


class UnknownKindError(EnqueueError):
    """The payload's model (or the kind string) is not registered with this ``Jobs``."""


class InvalidPayloadError(EnqueueError):
    """The payload does not validate against its kind's model.

    ``errors`` holds pydantic's structured error list.
    """

    def __init__(self, message: str, errors: list[dict[str, object]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class PayloadTooLargeError(EnqueueError):
    """The serialized payload is larger than ``Jobs(max_payload_bytes=...)``."""


class InvalidQueueNameError(EnqueueError):
    """A queue name outside the safe character set or length."""


class InvalidScheduleError(EnqueueError):
    """A naive ``run_at``, a negative ``delay``, or both given at once."""


class InvalidOptionError(EnqueueError):
    """An enqueue option out of range (priority, max_attempts)."""


class InvalidTextError(EnqueueError):
    """A text input (a payload string or key, a concurrency key) holds a lone surrogate, such as
    the ``"\\ud800"`` that ``json.loads`` makes of an escaped half of a pair: it has no UTF-8 form,
    and PostgreSQL stores only UTF-8. ``field`` names the input.
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class InvalidMetaError(EnqueueError):
    """A job's ``meta`` (given to enqueue, or added by an ``on_enqueue`` hook) is not a JSON object
    of string keys that JSON can store as is, or is larger than 8 KiB once serialized."""


class EnqueueHookError(EnqueueError):
    """An ``on_enqueue`` hook raised; its exception is this one's ``__cause__``. Nothing was
    written and the caller's transaction is as it was before the call."""


class DuplicateJobError(EnqueueError):
    """A unique job's key is held by another job and the enqueue said ``on_conflict="raise"``.
    Nothing was written and the transaction stays usable. ``existing_ids`` are the jobs holding
    the keys; ``positions`` the payloads refused (for ``enqueue_many``; ``[0]`` for ``enqueue``)."""

    def __init__(self, message: str, existing_ids: list[int], positions: list[int]) -> None:
        super().__init__(message)
        self.existing_ids = existing_ids
        self.positions = positions


class DependencyError(EnqueueError):
    """``depends_on`` names a job that cannot be accounted for: no row in the job table and no
    recorded outcome (never enqueued, or finished with nobody depending on it and since gone).
    Raised after one read and before anything is written: the transaction stays usable.
    ``job_ids`` are the unknown parents."""

    def __init__(self, message: str, job_ids: list[int]) -> None:
        super().__init__(message)
        self.job_ids = job_ids


class DatabaseURLError(SqlaJobsError):
    """A database URL that cannot be used (wrong scheme, unparseable)."""


class LeaseLostError(SqlaJobsError):
    """This worker's lease on the job expired and the job may now belong to another worker: the
    write was refused by the lease fence. Raised inside a handler by ``ctx.step``; let it propagate."""


class StepError(SqlaJobsError):
    """A durable step was misused: an empty name, or a result that is not JSON-serializable."""


class ResultError(SqlaJobsError):
    """A handler of a kind with ``results=True`` returned a value that cannot be stored: not
    JSON-serializable, or past ``MAX_RESULT_BYTES`` (64 KiB) of JSON. Its run fails
    (and is retried like any failure): its children would otherwise run without their input."""


class NotMigratedError(SqlaJobsError):
    """The queue table is missing, in another schema than the one looked in, or older than this
    version of sqla-jobs needs. ``problem`` says which; ``fix`` is a clause saying what to run or
    set ("to create it, run ...").

    Raised by the CLI and the worker before they start, and by :meth:`Jobs.enqueue
    <sqla_jobs.Jobs.enqueue>` (and the other enqueue calls) when the server refused the INSERT
    for a missing table: unlike an :class:`EnqueueError`, the caller's transaction is then
    aborted and must be rolled back. The database error it stands for is its ``__cause__``."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


class MigrationConflictError(SqlaJobsError):
    """``sqla-jobs migrate`` found sqla-jobs' tables in the care of another Alembic environment
    (its revisions in the application's ``alembic_version``, or nowhere): running its revisions
    would run them twice. Nothing was changed; the message says which tool to use."""


class JobCancelledError(SqlaJobsError):
    """The job was cancelled by an operator while it ran: raised by ``ctx.step`` instead of
    starting a new step; a sync handler may raise it too when it sees ``ctx.cancelled``."""


class OperationError(SqlaJobsError):
    """Base class of the errors of the operations (retry, cancel, pause): raised before anything
    changed, so the caller's transaction is as it was and stays usable."""


class JobNotFoundError(OperationError):
    """No job has one of the ids given; ``ids`` lists them."""

    def __init__(self, message: str, ids: list[int]) -> None:
        super().__init__(message)
        self.ids = ids


class NoResultError(OperationError):
    """``jobs.result``: job ``job_id`` has no stored result: it has not completed, its kind does
    not store results (``results=True``), or its result was pruned with its outcome."""

    def __init__(self, message: str, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobReferencedError(OperationError):
    """A job to delete is still referenced by a row of the application's (a foreign key that
    does not cascade); ``ids`` lists the jobs, ``detail`` is PostgreSQL's."""

    def __init__(self, message: str, ids: list[int], detail: str) -> None:
        super().__init__(message)
        self.ids = ids
        self.detail = detail


class ScheduleNotFoundError(OperationError):
    """No schedule of that name is declared in the application."""


class JobStateError(OperationError):
    """A job is in a state the operation does not apply to (retrying a running job, cancelling
    a dead one); ``states`` maps each such id to its state."""

    def __init__(self, message: str, states: dict[int, str]) -> None:
        super().__init__(message)
        self.states = states


class UniqueKeyTakenError(OperationError):
    """A job cannot be retried: another job holds its unique key (or two of the jobs to retry
    share one). Nothing changed. ``held`` maps each refused job to the job holding its key."""

    def __init__(self, message: str, held: dict[int, int]) -> None:
        super().__init__(message)
        self.held = held


class UnknownQueueError(OperationError):
    """A pause that asked for a known queue (``known_only=True``) named one that no pending or
    running job, recent finished job, schedule, live worker or stored queue row names: likely a
    typo. Nothing changed. ``known`` lists the queues the database knows of."""

    def __init__(self, message: str, queue: str, known: list[str]) -> None:
        super().__init__(message)
        self.queue = queue
        self.known = known


class QueueInUseError(OperationError):
    """A queue's row cannot be forgotten: the queue is paused and still in use (its jobs, a
    schedule or a live worker name it), so forgetting the row would resume it. Nothing changed."""

    def __init__(self, message: str, queue: str) -> None:
        super().__init__(message)
        self.queue = queue
