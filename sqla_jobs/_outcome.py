"""What happens to a job: the outcome rules, shared by the worker and ``sqla_jobs.testing``.

One place decides how a run ends: an unknown kind (or a kind without a handler) is a failure with
the default backoff, because a deploy may have the enqueuer ahead of the worker; a payload that no
longer validates against its kind's model is dead at once, because no retry can heal it; a
handler's exception or timeout is a failure with the kind's backoff; a normal return completes the
job. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import MISSING, dataclass, fields
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from sqla_jobs.backoff import DEFAULT_BACKOFF, Backoff
from sqla_jobs.context import ClaimedJob, Discard, Snooze
from sqla_jobs.db.failover import caused_by_lost
from sqla_jobs.errors import ResultError
from sqla_jobs.kinds import MAX_RESULT_BYTES, Kind, Registry, describe_errors, load_payload
from sqla_jobs.model import MAX_ERROR_CHARS
from sqla_jobs.sql.compiled import WorkerSQL

_ONE_US = timedelta(microseconds=1)
#: How long a run that met a failover waits before it runs again (microseconds).
LOST_RETRY_US = 1_000_000


class HandlerTimeout(Exception):
    """The handler ran past its kind's timeout."""


@dataclass(eq=False)
class Outcome:
    """How one run of ``job`` ended: completed when ``error`` is None; otherwise a failure, retried
    with ``backoff`` unless ``dead`` (or the failure budget is spent, which the database decides);
    snoozed when ``snooze_us`` is set, cancelled when ``cancelled``. ``error_class``, ``message``
    and ``traceback`` are the attempt's entry in the job's ``errors``."""

    job: ClaimedJob
    error: str | None = None
    dead: bool = False
    backoff: Backoff = DEFAULT_BACKOFF
    error_class: str | None = None
    message: str | None = None
    traceback: str | None = None
    snooze_us: int | None = None
    cancelled: bool = False
    #: How long the handler ran (seconds).
    runtime: float = 0.0
    #: The completion was committed in the handler's own transaction: nothing left to write.
    committed: bool = False
    #: An operator had asked to cancel the run, and its handler ran on to its end anyway.
    cancel_ignored: bool = False
    #: The run met a lost connection or a server that is not the primary any more (what it
    #: raised): back to the queue like a snooze, no attempt charged.
    lost: str | None = None
    #: The handler's return value as JSON text, for a kind with ``results=True`` (None: nothing
    #: to store).
    result: str | None = None


#: Every field of an :class:`Outcome` at its default (none has a default factory).
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Outcome) if f.name != "job"}
assert MISSING not in _DEFAULTS.values()


def completed(job: ClaimedJob, *, committed: bool = False, result: str | None = None) -> Outcome:
    """The outcome of a handler that returned: ``Outcome(job, committed=committed)``, its dict
    built in one call (the dataclass's constructor costs ~0.5 us, once per job a worker runs)."""
    outcome = object.__new__(Outcome)
    # A copy of the defaults and one store: half the cost of dict(_DEFAULTS, **changes).
    values = _DEFAULTS.copy()
    values["job"] = job
    if committed:
        values["committed"] = True
    if result is not None:
        values["result"] = result
    outcome.__dict__ = values
    return outcome


def _json_default(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode_result(job_id: int, kind: str, value: object) -> str:
    """``value`` (a handler's return) as the JSON text stored for a kind with ``results=True``:
    JSON types, pydantic models (``model_dump(mode="json")``) inside them or alone; at most
    :data:`~sqla_jobs.kinds.MAX_RESULT_BYTES`. Raises :class:`~sqla_jobs.ResultError` otherwise:
    the run fails, as the result is what its children run on."""
    try:
        # allow_nan=False: jsonb has no NaN or Infinity.
        text = json.dumps(value, default=_json_default, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultError(
            f"job {job_id} ({kind}): the handler succeeded but its result cannot be stored "
            f"as JSON ({exc}); the run fails and is retried"
        ) from None
    size = len(text.encode())
    if size > MAX_RESULT_BYTES:
        raise ResultError(
            f"job {job_id} ({kind}): the handler succeeded but its result is {size} bytes of "
            f"JSON, past the {MAX_RESULT_BYTES} allowed; the run fails and is retried (store "
            "large data elsewhere and return a reference to it)"
        )
    return text


def resolve(jobs: Registry, job: ClaimedJob) -> tuple[Kind, Any] | Outcome:
    """The kind and the decoded payload of ``job``, ready to run; or, for a job that cannot run,
    its outcome (unknown kind: a failure; a payload that no longer validates: dead)."""
    kind = jobs.kind_named(job.kind)
    if kind is None or kind.handler is None:
        return Outcome(
            job,
            error=f"unknown kind {job.kind!r}: this worker has no handler for it "
            "(is a deploy in progress?)",
            error_class="UnknownKind",
        )
    try:
        payload = job.payload
        if payload.__class__ is str:
            # load_payload's common case inline: this runs once per job a worker runs.
            return kind, kind.model.__pydantic_validator__.validate_json(payload)
        return kind, load_payload(kind.model, payload)
    except ValidationError as exc:
        return Outcome(
            job,
            error=f"payload no longer validates against {kind.model.__qualname__}: "
            + describe_errors(exc),
            dead=True,
            backoff=kind.options.backoff,
            error_class="InvalidPayload",
        )


def failed(job: ClaimedJob, kind: Kind, exc: BaseException, *, in_session: bool = False) -> Outcome:
    """The outcome of a handler that raised ``exc``: a failure with the kind's backoff (a
    :class:`~sqla_jobs.Discard`: dead at once; a timeout: its own message).

    With ``in_session`` (the handler ran in a Session on the queue's database, its completion in
    the same transaction) an error caused by a lost connection or a server that is not the primary
    any more is the database's failover, not the job's failure: the job goes back to the queue
    (its transaction rolled back, so its effects happen once) without an attempt charged."""
    if in_session and caused_by_lost(exc):
        return Outcome(job, snooze_us=LOST_RETRY_US, lost=describe(exc))
    if isinstance(exc, Discard):
        return Outcome(
            job,
            error=f"discarded: {exc.reason}",
            dead=True,
            error_class="Discard",
            message=exc.reason,
        )
    error = str(exc) if isinstance(exc, HandlerTimeout) else describe(exc)
    return Outcome(
        job,
        error=error,
        backoff=kind.options.backoff,
        error_class=type(exc).__name__,
        message=str(exc),
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


def cancelled(job: ClaimedJob, how: str) -> Outcome:
    """The outcome of a run an operator cancelled; ``how`` says how the handler stopped."""
    return Outcome(job, error=f"cancelled: {how}", cancelled=True)


def snoozed(job: ClaimedJob, snooze: Snooze) -> Outcome:
    """The outcome of a handler that snoozed its job."""
    return Outcome(job, snooze_us=snooze.delay // _ONE_US)


def describe(exc: BaseException) -> str:
    """``Class: message (at file:line)``, truncated: logs and ``last_error`` must not carry
    trace storms (the fail statement truncates again)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}"[: MAX_ERROR_CHARS - len(where)] + where


def fail_params(sql: WorkerSQL, outcome: Outcome) -> dict[str, Any]:
    """The fail statement's parameters for a failed ``outcome``."""
    return sql.fail.params(
        id=outcome.job.id,
        token=outcome.job.lease_token,
        error=outcome.error,
        force_dead=outcome.dead,
        error_class=outcome.error_class,
        message=outcome.message if outcome.message is not None else outcome.error,
        traceback=outcome.traceback,
        **outcome.backoff.sql_params(),
    )
