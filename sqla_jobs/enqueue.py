"""Enqueue into the caller's ``Session`` (sync) or ``AsyncSession``: never a connection of our own,
never a commit. The job exists if and only if the caller's transaction commits.

Everything that can be wrong with the input is checked before any SQL runs, so an error leaves the
caller's transaction untouched and usable.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import repeat
from typing import TYPE_CHECKING, Any, cast

import psycopg
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError
from sqlalchemy import Dialect, Row, inspect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Mapper, Session, configure_mappers, make_transient_to_detached

from . import statements
from .errors import (
    EnqueueError,
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
_INSERT_ONE = statements.insert_job()
_INSERT_ONE_NOTIFY = statements.insert_job_and_notify()
_INSERT_MANY = statements.insert_jobs()
_RESERVE_IDS = statements.reserve_job_ids()
_NOTIFY = statements.notify()
_JOB_MAPPER: Mapper[Job] = inspect(Job)
_JOB_BIND = {"mapper": _JOB_MAPPER}
#: Below this many jobs enqueue_many sends one INSERT; from it on, it reserves ids and COPYs.
COPY_THRESHOLD = 64
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
        raise InvalidPayloadError(
            f"payload for kind {kind.name!r} cannot be serialized as {model.__qualname__}: {exc}"
        ) from None
    data = dumped.decode()
    if b"\\u0000" in dumped and _JSON_NUL.search(data):
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
    q, p, m = _options(kind, queue, priority, max_attempts)
    instance, payload_json = serialize(kind, body, max_bytes)
    key, limit = concurrency(kind, instance, concurrency_key)
    return Prepared(
        kind=kind,
        payload_json=payload_json,
        queue=q,
        priority=p,
        max_attempts=m,
        max_crashes=kind.options.max_crashes,
        concurrency_key=key,
        concurrency_limit=limit,
    )


def _options(
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


@dataclass
class Batch:
    """Validated jobs as parallel columns, in payload order: what ``enqueue_many`` writes. One
    list per :data:`statements.BULK_COLUMNS` entry, under the same name."""

    queue: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    payload: list[str] = field(default_factory=list)
    priority: list[int] = field(default_factory=list)
    max_attempts: list[int] = field(default_factory=list)
    max_crashes: list[int] = field(default_factory=list)
    concurrency_key: list[str | None] = field(default_factory=list)
    concurrency_limit: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.kind)

    def columns(self) -> list[list[Any]]:
        """The lists in :data:`statements.BULK_COLUMNS` order."""
        return [getattr(self, name) for name in statements.BULK_COLUMNS]


def prepare_many(
    registry: Registry,
    payloads: Iterable[BaseModel],
    *,
    max_bytes: int,
    queue: str | None,
    priority: int | None,
    max_attempts: int | None,
) -> Batch:
    """:func:`prepare` for every payload, into one :class:`Batch`; no I/O. The first bad payload
    or option raises, naming the payload's position."""
    batch = Batch()
    # Per payload type: its kind and resolved options, looked up and checked once.
    resolved: dict[type[Any], tuple[Kind, str, int, int]] = {}
    for index, payload in enumerate(payloads):
        try:
            entry = resolved.get(type(payload))
            if entry is None:
                if not isinstance(payload, BaseModel):
                    raise InvalidPayloadError(
                        "enqueue_many takes instances of registered pydantic models, got "
                        f"{type(payload).__qualname__}"
                    )
                kind = registry.by_model(type(payload))
                entry = (kind, *_options(kind, queue, priority, max_attempts))
                resolved[type(payload)] = entry
            kind, q, p, m = entry
            instance, payload_json = serialize(kind, payload, max_bytes)
            key, limit = concurrency(kind, instance, None)
        except EnqueueError as exc:
            exc.args = (f"payload {index}: {exc.args[0]}", *exc.args[1:])
            raise
        batch.queue.append(q)
        batch.kind.append(kind.name)
        batch.payload.append(payload_json)
        batch.priority.append(p)
        batch.max_attempts.append(m)
        batch.max_crashes.append(kind.options.max_crashes)
        batch.concurrency_key.append(key)
        batch.concurrency_limit.append(limit)
    return batch


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


def _many_params(batch: Batch, run_at: datetime | None, delay: timedelta) -> dict[str, Any]:
    arrays = dict(zip(_ARRAY_PARAMS, batch.columns(), strict=True))
    return {**arrays, "run_at": run_at, "delay_us": delay // _ONE_US}


#: insert_jobs()'s array parameter names, in statements.BULK_COLUMNS order.
_ARRAY_PARAMS = (
    "queues",
    "kinds",
    "payloads",
    "priorities",
    "max_attempts",
    "max_crashes",
    "concurrency_keys",
    "concurrency_limits",
)


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


def _attach(session: Session, job: Prepared, filled: Row[Any]) -> Job:
    """The inserted job as a persistent ``Job`` in ``session``, without loading it back: the
    database's values (``filled``: :data:`statements.FILLED_COLUMNS`) plus what was bound. This is
    what an ORM load of the RETURNING row would give, at a fraction of the cost on the hot path."""
    if not _configured:
        _configure()
    obj = _JOB_MAPPER.class_manager.new_instance()
    obj.__dict__.update(
        zip(_FILLED_KEYS, filled, strict=True),
        queue=job.queue,
        kind=job.kind.name,
        payload=json.loads(job.payload_json),
        priority=job.priority,
        max_attempts=job.max_attempts,
        max_crashes=job.max_crashes,
        concurrency_key=job.concurrency_key,
        concurrency_limit=job.concurrency_limit,
        lease_token=None,
        lease_expires_at=None,
        locked_by=None,
        last_error=None,
        steps=None,
    )
    make_transient_to_detached(obj)
    session.add(obj)
    return obj


_FILLED_KEYS = tuple(c.key for c in statements.FILLED_COLUMNS)
_configured = False


def _configure() -> None:
    """Configure the mappers once (an ORM query would have): a ``Job`` built by :func:`_attach`
    needs its attribute instrumentation in place."""
    global _configured
    configure_mappers()
    _configured = True


def _copy_error(
    dialect: Dialect, dbapi_connection: Any, exc: psycopg.Error, sql: str
) -> StatementError:
    """A driver error from COPY, as SQLAlchemy would have raised it from ``execute`` (an
    ``IntegrityError``, ``OperationalError``, ...). When its ``connection_invalidated`` is set the
    connection is lost, and the caller invalidates it so the pool does not hand it out again."""
    disconnect = bool(dialect.is_disconnect(cast(Any, exc), dbapi_connection, None))
    return DBAPIError.instance(
        sql, None, exc, psycopg.Error, connection_invalidated=disconnect, dialect=dialect
    )


def _reserve_params(
    batch: Batch, run_at: datetime | None, delay: timedelta, schema: str | None
) -> dict[str, Any]:
    return {
        "table": statements.job_table_name(schema),
        "n": len(batch),
        "run_at": run_at,
        "delay_us": delay // _ONE_US,
    }


def _copy_rows(batch: Batch, ids: list[int], run_at: object) -> Iterable[tuple[Any, ...]]:
    return zip(ids, *batch.columns(), repeat(run_at), strict=False)


def _copy_sql(schema: str | None) -> str:
    sql = _COPY_SQL.get(schema)
    if sql is None:
        sql = _COPY_SQL[schema] = statements.copy_jobs(schema).text
    return sql


_COPY_SQL: dict[str | None, str] = {}


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
    conn = session.connection(bind_arguments=_JOB_BIND)
    stmt, params = _insert_one(session, job, run_at, delay, channel)
    filled = conn.execute(stmt, params, execution_options=_exec_options(schema)).one()
    _queues_to_notify(session, [job.queue])
    return _attach(session, job, filled)


def enqueue_many(
    session: Session,
    batch: Batch,
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> list[int]:
    """Insert a batch through ``session``; returns the ids in payload order.

    Small batches are one ``INSERT ... SELECT FROM unnest(...)``. From :data:`COPY_THRESHOLD` jobs
    on, on psycopg 3, the ids are reserved in one statement and the rows sent by ``COPY`` on the
    session's own connection, inside its transaction: several times faster per job.
    """
    if not batch:
        return []
    opts = _exec_options(schema)
    conn = session.connection(bind_arguments=_JOB_BIND)
    driver = conn.connection.driver_connection
    if len(batch) >= COPY_THRESHOLD and isinstance(driver, psycopg.Connection):
        reserved = conn.execute(
            _RESERVE_IDS, _reserve_params(batch, run_at, delay, schema), execution_options=opts
        ).one()
        ids: list[int] = sorted(reserved.ids)
        when = reserved.run_at
        sql = _copy_sql(schema)
        try:
            with driver.cursor() as cur, cur.copy(sql) as copy:
                for row in _copy_rows(batch, ids, when):
                    copy.write_row(row)
        except psycopg.Error as exc:
            error = _copy_error(conn.dialect, conn.connection.dbapi_connection, exc, sql)
            if error.connection_invalidated:
                conn.invalidate(exc)
            raise error from exc
    else:
        ids = list(
            conn.scalars(_INSERT_MANY, _many_params(batch, run_at, delay), execution_options=opts)
        )
    for q in _queues_to_notify(session, batch.queue):
        conn.execute(_NOTIFY, {"channel": channel, "queue": q}, execution_options=opts)
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
    conn = await session.connection(bind_arguments=_JOB_BIND)
    stmt, params = _insert_one(session.sync_session, job, run_at, delay, channel)
    result = await conn.execute(stmt, params, execution_options=_exec_options(schema))
    filled = result.one()
    _queues_to_notify(session.sync_session, [job.queue])
    return _attach(session.sync_session, job, filled)


async def enqueue_many_async(
    session: AsyncSession,
    batch: Batch,
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> list[int]:
    """:func:`enqueue_many` for an ``AsyncSession`` (COPY on psycopg's ``AsyncConnection``)."""
    if not batch:
        return []
    opts = _exec_options(schema)
    conn = await session.connection(bind_arguments=_JOB_BIND)
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if len(batch) >= COPY_THRESHOLD and isinstance(driver, psycopg.AsyncConnection):
        reserved = await conn.execute(
            _RESERVE_IDS, _reserve_params(batch, run_at, delay, schema), execution_options=opts
        )
        row = reserved.one()
        ids: list[int] = sorted(row.ids)
        when = row.run_at
        sql = _copy_sql(schema)
        try:
            async with driver.cursor() as cur, cur.copy(sql) as copy:
                for values in _copy_rows(batch, ids, when):
                    await copy.write_row(values)
        except psycopg.Error as exc:
            error = _copy_error(conn.dialect, raw.dbapi_connection, exc, sql)
            if error.connection_invalidated:
                await conn.invalidate(exc)
            raise error from exc
    else:
        result = await conn.scalars(
            _INSERT_MANY, _many_params(batch, run_at, delay), execution_options=opts
        )
        ids = list(result)
    for q in _queues_to_notify(session.sync_session, batch.queue):
        await conn.execute(_NOTIFY, {"channel": channel, "queue": q}, execution_options=opts)
    return ids
