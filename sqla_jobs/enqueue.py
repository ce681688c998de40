"""Enqueue into the caller's ``Session`` (sync) or ``AsyncSession``: never a connection of our own,
never a commit. The job exists if and only if the caller's transaction commits.

Everything that can be wrong with the input is checked before any SQL runs, so an error leaves the
caller's transaction untouched and usable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from . import statements
from .errors import (
    InvalidOptionError,
    InvalidPayloadError,
    InvalidQueueNameError,
    InvalidScheduleError,
    PayloadTooLargeError,
)
from .kinds import Kind, Registry, check_name
from .model import Job

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

_NOTIFIED_KEY = "sqla_jobs.notified"
_INSERT_ONE = select(Job).from_statement(statements.insert_job().returning(*Job.__table__.c))
_INSERT_ONE_NOTIFY = select(Job).from_statement(statements.insert_job_and_notify())
_INSERT_MANY = statements.insert_jobs()
_NOTIFY = statements.notify()
_ZERO = timedelta(0)
_ONE_US = timedelta(microseconds=1)
#: Longest delay: now() + delay must stay inside timestamptz (year 294276), and the delay is bound as
#: microseconds that float8 interval arithmetic carries exactly (2**53 us is about 285 years).
MAX_DELAY = timedelta(days=100 * 365)
#: A JSON \u0000 escape (odd number of backslashes before u0000): jsonb refuses it.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True)
class Prepared:
    """One validated job, ready to insert."""

    kind: Kind
    payload_json: str
    queue: str
    priority: int
    max_attempts: int
    max_crashes: int
    concurrency_key: str | None
    concurrency_limit: int | None


def serialize(
    kind: Kind, payload: BaseModel | Mapping[str, Any], max_bytes: int
) -> tuple[BaseModel, str]:
    """Validate ``payload`` against ``kind.model``; return the validated model and its JSON text.

    A model instance is serialized and validated back, so what is written is exactly what the worker
    will accept (an instance built with ``model_construct`` or mutated after validation is caught
    here, not in the worker).
    """
    model = kind.model
    try:
        if isinstance(payload, BaseModel):
            if type(payload) is not model:
                raise InvalidPayloadError(
                    f"kind {kind.name!r} takes {model.__qualname__}, got {type(payload).__qualname__}"
                )
            data = payload.model_dump_json(warnings="error")
        else:
            data = model.model_validate(payload).model_dump_json(warnings="error")
        # Validate the dump back, whatever the input: the worker validates the dump, and a dump can
        # differ from what validated (NaN is written as null).
        instance = model.model_validate_json(data)
    except ValidationError as exc:
        raise InvalidPayloadError(
            f"payload for kind {kind.name!r} does not validate against {model.__qualname__}: "
            f"{exc.error_count()} error(s): "
            + "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()
            ),
            errors=[dict(e) for e in exc.errors()],
        ) from None
    except PydanticSerializationError as exc:
        raise InvalidPayloadError(
            f"payload for kind {kind.name!r} cannot be serialized as {model.__qualname__}: {exc}"
        ) from None
    if _JSON_NUL.search(data):
        raise InvalidPayloadError(
            f"payload for kind {kind.name!r} contains a NUL character (\\u0000), which jsonb "
            "cannot store; drop it or encode the value (e.g. base64)"
        )
    size = len(data.encode())
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"payload for kind {kind.name!r} is {size} bytes, over the limit of {max_bytes}; "
            "store large data in your own table and enqueue its id, or raise Jobs(max_payload_bytes=)"
        )
    return instance, data


def concurrency(kind: Kind, instance: BaseModel, key: str | None) -> tuple[str | None, int | None]:
    """The job's (concurrency_key, concurrency_limit): the enqueue's ``key``, else the kind's key
    function applied to the validated payload, else none."""
    limit = kind.options.concurrency_limit
    if key is not None:
        if limit is None:
            raise InvalidOptionError(
                f"kind {kind.name!r} has no concurrency_limit; register it with one to pass "
                "concurrency_key"
            )
    elif kind.options.concurrency_key is not None:
        try:
            key = kind.options.concurrency_key(instance)
        except Exception as exc:
            raise InvalidPayloadError(
                f"concurrency_key of kind {kind.name!r} failed on this payload: {exc!r}"
            ) from None
    else:
        return None, None
    if not isinstance(key, str) or not 1 <= len(key) <= 256 or "\x00" in key:
        raise InvalidOptionError(
            f"concurrency key for kind {kind.name!r} must be a str of 1-256 characters, got {key!r}"
        )
    return key, limit


def prepare(
    registry: Registry,
    payload: BaseModel | str,
    data: Mapping[str, Any] | None,
    *,
    max_bytes: int,
    queue: str | None,
    priority: int | None,
    max_attempts: int | None,
    concurrency_key: str | None = None,
) -> Prepared:
    """Resolve the kind, validate the payload and the options; no I/O."""
    if isinstance(payload, str):
        kind = registry.by_name(payload)
        if data is None:
            raise InvalidPayloadError(
                f"kind {payload!r} given by name needs its payload as a mapping"
            )
        body: BaseModel | Mapping[str, Any] = data
    elif isinstance(payload, BaseModel):
        kind = registry.by_model(type(payload))
        if data is not None:
            raise InvalidPayloadError(
                "give either a payload model instance, or a kind name and a mapping"
            )
        body = payload
    else:
        raise InvalidPayloadError(
            f"expected a registered pydantic model instance or a kind name, got {type(payload).__qualname__}"
        )
    opts = kind.options
    q = opts.queue if queue is None else queue
    if queue is not None:
        try:
            check_name("queue", queue)
        except ValueError as exc:
            raise InvalidQueueNameError(str(exc)) from None
    p = opts.priority if priority is None else priority
    if isinstance(p, bool) or not isinstance(p, int) or not -32768 <= p <= 32767:
        raise InvalidOptionError(f"priority must be an int in [-32768, 32767], got {p!r}")
    m = opts.max_attempts if max_attempts is None else max_attempts
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 2**31 - 1:
        raise InvalidOptionError(f"max_attempts must be an int >= 1, got {m!r}")
    instance, payload_json = serialize(kind, body, max_bytes)
    key, limit = concurrency(kind, instance, concurrency_key)
    return Prepared(
        kind=kind,
        payload_json=payload_json,
        queue=q,
        priority=p,
        max_attempts=m,
        max_crashes=opts.max_crashes,
        concurrency_key=key,
        concurrency_limit=limit,
    )


def schedule(
    delay: timedelta | float | None, run_at: datetime | None
) -> tuple[datetime | None, timedelta]:
    """Check ``delay``/``run_at`` and return the (run_at, delay) pair the insert binds.

    The delay is added to the database's ``now()``; Python's clock is never read.
    """
    if delay is not None and run_at is not None:
        raise InvalidScheduleError("give delay or run_at, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidScheduleError(
                f"run_at must be a datetime, got {type(run_at).__qualname__}"
            )
        if run_at.tzinfo is None or run_at.tzinfo.utcoffset(run_at) is None:
            raise InvalidScheduleError(
                "run_at is a naive datetime; pass an aware one (e.g. datetime.now(timezone.utc)) "
                "or use delay=, which the database adds to its own clock"
            )
        return run_at, _ZERO
    if delay is None:
        return None, _ZERO
    if isinstance(delay, bool) or not isinstance(delay, (timedelta, int, float)):
        raise InvalidScheduleError(
            f"delay must be a timedelta or seconds, got {type(delay).__qualname__}"
        )
    if not isinstance(delay, timedelta):
        if not math.isfinite(delay):
            raise InvalidScheduleError(f"delay must be finite, got {delay!r}")
        if delay > MAX_DELAY.total_seconds():
            raise InvalidScheduleError(f"delay must be at most {MAX_DELAY}, got {delay!r} s")
        delay = timedelta(seconds=delay)
    if delay < _ZERO:
        raise InvalidScheduleError(f"delay must not be negative, got {delay}")
    if delay > MAX_DELAY:
        raise InvalidScheduleError(
            f"delay must be at most {MAX_DELAY}, got {delay}; use run_at= for a far date"
        )
    return None, delay


def _one_params(job: Prepared, run_at: datetime | None, delay: timedelta) -> dict[str, Any]:
    return {
        "queue": job.queue,
        "kind": job.kind.name,
        "payload": job.payload_json,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "max_crashes": job.max_crashes,
        "concurrency_key": job.concurrency_key,
        "concurrency_limit": job.concurrency_limit,
        "run_at": run_at,
        "delay_us": delay // _ONE_US,
    }


def _many_params(jobs: list[Prepared], run_at: datetime | None, delay: timedelta) -> dict[str, Any]:
    return {
        "queues": [j.queue for j in jobs],
        "kinds": [j.kind.name for j in jobs],
        "payloads": [j.payload_json for j in jobs],
        "priorities": [j.priority for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "max_crashes": [j.max_crashes for j in jobs],
        "concurrency_keys": [j.concurrency_key for j in jobs],
        "concurrency_limits": [j.concurrency_limit for j in jobs],
        "run_at": run_at,
        "delay_us": delay // _ONE_US,
    }


def _exec_options(schema: str | None) -> dict[str, Any]:
    return {} if schema is None else {"schema_translate_map": {None: schema}}


def _notified(session: Session) -> set[str]:
    """The queues already notified in the session's current (innermost) transaction.

    Postgres folds identical notifications within a transaction anyway; tracking them here saves the
    work. Keyed on the innermost transaction, so a rolled-back savepoint (whose NOTIFY is discarded
    with it) cannot suppress the outer transaction's wakeup. Before the session has begun a
    transaction there is none, and nothing has been notified.
    """
    tx = session.get_nested_transaction() or session.get_transaction()
    if tx is None:
        return set()
    seen = session.info.get(_NOTIFIED_KEY)
    if seen is None or seen[0] is not tx:
        seen = (tx, set[str]())
        session.info[_NOTIFIED_KEY] = seen
    notified: set[str] = seen[1]
    return notified


def _queues_to_notify(session: Session, queues: Iterable[str]) -> list[str]:
    """Queues not yet notified in the current transaction; marks them notified."""
    seen = _notified(session)
    fresh = [q for q in dict.fromkeys(queues) if q not in seen]
    seen.update(fresh)
    return fresh


def _insert_one(
    session: Session, job: Prepared, run_at: datetime | None, delay: timedelta, channel: str
) -> tuple[Any, dict[str, Any]]:
    """The statement and parameters for one job: with the wakeup folded in, unless this
    transaction already notified the job's queue."""
    params = _one_params(job, run_at, delay)
    if job.queue in _notified(session):
        return _INSERT_ONE, params
    return _INSERT_ONE_NOTIFY, {**params, "channel": channel, "queue_name": job.queue}


def enqueue(
    session: Session,
    job: Prepared,
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> Job:
    """Insert one prepared job through ``session`` and queue its wakeup; returns the ``Job``."""
    opts = _exec_options(schema)
    stmt, params = _insert_one(session, job, run_at, delay, channel)
    row: Job = session.scalars(stmt, params, execution_options=opts).one()
    _queues_to_notify(session, [job.queue])
    return row


def enqueue_many(
    session: Session,
    jobs: list[Prepared],
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> list[int]:
    """Insert prepared jobs in one statement through ``session``; returns their ids in order."""
    if not jobs:
        return []
    opts = _exec_options(schema)
    ids = list(
        session.scalars(_INSERT_MANY, _many_params(jobs, run_at, delay), execution_options=opts)
    )
    for q in _queues_to_notify(session, [j.queue for j in jobs]):
        session.execute(_NOTIFY, {"channel": channel, "queue": q}, execution_options=opts)
    return ids


async def enqueue_async(
    session: AsyncSession,
    job: Prepared,
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> Job:
    """:func:`enqueue` for an ``AsyncSession``."""
    opts = _exec_options(schema)
    stmt, params = _insert_one(session.sync_session, job, run_at, delay, channel)
    result = await session.scalars(stmt, params, execution_options=opts)
    row: Job = result.one()
    _queues_to_notify(session.sync_session, [job.queue])
    return row


async def enqueue_many_async(
    session: AsyncSession,
    jobs: list[Prepared],
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> list[int]:
    """:func:`enqueue_many` for an ``AsyncSession``."""
    if not jobs:
        return []
    opts = _exec_options(schema)
    result = await session.scalars(
        _INSERT_MANY, _many_params(jobs, run_at, delay), execution_options=opts
    )
    ids = list(result)
    for q in _queues_to_notify(session.sync_session, [j.queue for j in jobs]):
        await session.execute(_NOTIFY, {"channel": channel, "queue": q}, execution_options=opts)
    return ids
