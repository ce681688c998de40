"""What enqueue checks of one job before any SQL runs: the payload against its kind's model, the
options, the schedule (a batch's checks, run by run, are :mod:`~sqla_jobs.enqueue.validate_many`).
Pure functions, no I/O: an error raised here leaves the caller's transaction untouched and usable,
and nothing was written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from sqla_jobs.enqueue import text as _text
from sqla_jobs.enqueue.meta import JSON_NUL
from sqla_jobs.enqueue.meta import MAX_META_BYTES as MAX_META_BYTES
from sqla_jobs.enqueue.meta import MetaArg as MetaArg
from sqla_jobs.enqueue.meta import meta_json as meta_json
from sqla_jobs.enqueue.row import Batch as Batch
from sqla_jobs.enqueue.row import Prepared as Prepared
from sqla_jobs.errors import (
    InvalidOptionError,
    InvalidPayloadError,
    InvalidQueueNameError,
    InvalidScheduleError,
    PayloadTooLargeError,
)
from sqla_jobs.kinds import Kind, Registry, check_name
from sqla_jobs.rate_limit import rate_key
from sqla_jobs.unique import Unique, UniqueKey, key_of

_ZERO = timedelta(0)
#: Longest delay: now() + delay must stay inside timestamptz (year 294276), and the delay is bound as
#: microseconds that float8 interval arithmetic carries exactly (2**53 us is about 285 years).
MAX_DELAY = timedelta(days=100 * 365)


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
        else:
            payload = model.model_validate(payload)
        # What model_dump_json and model_validate_json call, minus their wrappers: this runs once
        # per job of an enqueue_many.
        dumped: bytes = model.__pydantic_serializer__.to_json(payload, warnings="error")
        # Validate the dump back, whatever the input: the worker validates the dump, and a dump can
        # differ from what validated (NaN is written as null).
        instance = model.__pydantic_validator__.validate_json(dumped)
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
        if _text.SERIALIZATION_MESSAGE in str(exc):
            _text.check_payload(kind.name, payload)
        raise InvalidPayloadError(
            f"payload for kind {kind.name!r} cannot be serialized as {model.__qualname__}: {exc}"
        ) from None
    if _text.REPLACEMENT in dumped:
        _text.check_payload(kind.name, payload)
    data = dumped.decode()
    if b"\\u0000" in dumped and JSON_NUL.search(data):
        raise InvalidPayloadError(
            f"payload for kind {kind.name!r} contains a NUL character (\\u0000), which jsonb "
            "cannot store; drop it or encode the value (e.g. base64)"
        )
    size = len(dumped)
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
    _text.check(f"concurrency key for kind {kind.name!r}", "concurrency_key", key)
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
    meta: Mapping[str, Any] | None = None,
    unique_key: str | None = None,
) -> Prepared:
    """Resolve the kind, validate the payload, the options, ``meta`` and the unique key; no
    I/O."""
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
    q, p, m = options_of(kind, queue, priority, max_attempts)
    instance, payload_json = serialize(kind, body, max_bytes)
    key, limit = concurrency(kind, instance, concurrency_key)
    return Prepared(
        kind=kind,
        payload=payload_json,
        queue=q,
        priority=p,
        max_attempts=m,
        max_crashes=kind.options.max_crashes,
        concurrency_key=key,
        concurrency_limit=limit,
        meta=None if meta is None else meta_json(meta),
        rate_key=rate_key(kind.name, kind.options.rate_limit, instance),
        unique=unique_of(kind, payload_json, q, unique_key),
    )


def unique_of(kind: Kind, payload_json: str, queue: str, explicit: str | None) -> UniqueKey | None:
    """The job's unique key: from ``explicit`` (any kind; the kind's :class:`Unique` states and
    period if it declares one, else pending and running), else from the kind's declaration."""
    unique = kind.options.unique
    if explicit is not None:
        if not isinstance(explicit, str) or not 1 <= len(explicit) <= 1000 or "\x00" in explicit:
            raise InvalidOptionError(
                f"unique_key for kind {kind.name!r} must be a str of 1-1000 characters without "
                f"NUL, got {explicit!r}"
            )
        _text.check(f"unique_key for kind {kind.name!r}", "unique_key", explicit)
        if unique is None:
            unique = Unique().check(kind.model)
    if unique is None:
        return None
    return key_of(kind.name, unique, payload_json, queue, explicit)


def options_of(
    kind: Kind, queue: str | None, priority: int | None, max_attempts: int | None
) -> tuple[str, int, int]:
    """The job's (queue, priority, max_attempts): each override if given (checked), else the
    kind's."""
    opts = kind.options
    if queue is not None:
        try:
            check_name("queue", queue)
        except ValueError as exc:
            raise InvalidQueueNameError(str(exc)) from None
    q = opts.queue if queue is None else queue
    p = opts.priority if priority is None else priority
    if isinstance(p, bool) or not isinstance(p, int) or not -32768 <= p <= 32767:
        raise InvalidOptionError(f"priority must be an int in [-32768, 32767], got {p!r}")
    m = opts.max_attempts if max_attempts is None else max_attempts
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 2**31 - 1:
        raise InvalidOptionError(f"max_attempts must be an int >= 1, got {m!r}")
    return q, p, m


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
