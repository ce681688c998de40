"""What happens to a job: the outcome rules, shared by the worker and ``sqla_jobs.testing``.

One place decides how a run ends: an unknown kind (or a kind without a handler) is a failure with
the default backoff, because a deploy may have the enqueuer ahead of the worker; a payload that no
longer validates against its kind's model is dead at once, because no retry can heal it; a
handler's exception or timeout is a failure with the kind's backoff; a normal return completes the
job. Pure: no I/O, no clock.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from sqla_jobs.backoff import DEFAULT_BACKOFF, Backoff
from sqla_jobs.context import ClaimedJob, Discard, Snooze
from sqla_jobs.kinds import Kind, Registry, describe_errors, load_payload
from sqla_jobs.model import MAX_ERROR_CHARS
from sqla_jobs.sql.compiled import WorkerSQL

_ONE_US = timedelta(microseconds=1)


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
        return kind, load_payload(kind.model, job.payload)
    except ValidationError as exc:
        return Outcome(
            job,
            error=f"payload no longer validates against {kind.model.__qualname__}: "
            + describe_errors(exc),
            dead=True,
            backoff=kind.options.backoff,
            error_class="InvalidPayload",
        )


def failed(job: ClaimedJob, kind: Kind, exc: BaseException) -> Outcome:
    """The outcome of a handler that raised ``exc``: a failure with the kind's backoff (a
    :class:`~sqla_jobs.Discard`: dead at once; a timeout: its own message)."""
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
