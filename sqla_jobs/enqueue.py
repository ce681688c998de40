"""Enqueue into the caller's ``Session`` (sync) or ``AsyncSession``: never a connection of our own,
never a commit. The job exists if and only if the caller's transaction commits.

The input arrives checked (:mod:`sqla_jobs.validate`): nothing here raises for bad input, and the
statements come from :mod:`sqla_jobs.statements`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from itertools import chain
from typing import TYPE_CHECKING, Any, cast

import psycopg
from sqlalchemy import Dialect, Row, inspect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Mapper, Session, configure_mappers, make_transient_to_detached
from sqlalchemy.orm.attributes import instance_state

from . import statements
from .errors import EnqueueError
from .model import Job
from .validate import Batch, Prepared

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
_ONE_US = timedelta(microseconds=1)
_SAVEPOINT, _ROLLBACK_TO_SAVEPOINT, _RELEASE_SAVEPOINT = statements.COPY_SAVEPOINT
#: Payloads validated at a time by enqueue_many, while the server stores the previous ones.
CHUNK = 1024


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
    names = (name for name, _ in statements.BULK_ARRAY_PARAMS)
    arrays = dict(zip(names, batch.columns(), strict=True))
    return {**arrays, "run_at": run_at, "delay_us": delay // _ONE_US}


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
    # Registered as inserted by the innermost transaction, as a flush registers an object it
    # inserts: a rollback of that transaction (or of the savepoint) then makes it transient, as it
    # does the Session's own inserts. Added as a detached object, it would stay persistent after
    # the rollback, refreshing from a row that no longer exists (ObjectDeletedError).
    tx = session._transaction
    if tx is not None:
        tx._new[instance_state(obj)] = True
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
    count: int, run_at: datetime | None, delay: timedelta, schema: str | None
) -> dict[str, Any]:
    return {
        "table": statements.job_table_name(schema),
        "n": count,
        "run_at": run_at,
        "delay_us": delay // _ONE_US,
    }


#: COPY's text format: what a text value must escape, and its NULL.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_NULL = "\\N"
#: Rows per string handed to ``Copy.write`` (about 1 MB for small payloads).
_COPY_CHUNK = 256


def _copy_text(batch: Batch, ids: list[int], run_at: datetime) -> Iterator[str]:
    """The batch as COPY text-format data, in chunks of :data:`_COPY_CHUNK` rows.

    Formatted here rather than by ``Copy.write_row``, which adapts each of the ten values of each
    row one by one (the largest part of enqueue_many's time, profiled). The values are already
    checked: queue and kind names are plain (``NAME_RE``), the numbers are ints, a payload is JSON
    (whose only character COPY must escape is the backslash, unless a hand-written text holds a raw
    tab or newline), and a concurrency key is any text.
    """
    when = run_at.isoformat()
    # In statements.COPY_COLUMNS order: the id, the batch's columns, run_at.
    columns = batch.columns()
    for start in range(0, len(ids), _COPY_CHUNK):
        stop = start + _COPY_CHUNK
        queues, kinds, payloads, priorities, attempts, crashes, keys, limits = (
            column[start:stop] for column in columns
        )
        text = "".join(payloads)
        if "\n" in text or "\t" in text or "\r" in text:
            payloads = [p.translate(_COPY_ESCAPES) for p in payloads]
        elif "\\" in text:
            payloads = [p.replace("\\", "\\\\") for p in payloads]
        keys = (
            [_COPY_NULL if k is None else k.translate(_COPY_ESCAPES) for k in keys]
            if keys.count(None) != len(keys)
            else [_COPY_NULL] * len(keys)
        )
        limits = [_COPY_NULL if v is None else v for v in limits]
        rows = zip(
            ids[start:stop], queues, kinds, payloads, priorities, attempts, crashes, keys, limits,
            strict=True,
        )  # fmt: skip
        yield "".join(
            [
                f"{i}\t{q}\t{k}\t{p}\t{pr}\t{ma}\t{mc}\t{ck}\t{cl}\t{when}\n"
                for i, q, k, p, pr, ma, mc, ck, cl in rows
            ]
        )


@functools.cache
def _copy_sql(schema: str | None) -> str:
    return statements.copy_jobs(schema).text


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
    count: int,
    chunks: Iterator[Batch],
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> list[int]:
    """Insert ``count`` jobs, validated a chunk at a time by ``chunks``, through ``session``;
    returns the ids in payload order.

    Small batches are one ``INSERT ... SELECT FROM unnest(...)``. From :data:`COPY_THRESHOLD` jobs
    on, on psycopg 3, the ids are reserved in one statement and the rows sent by ``COPY`` on the
    session's own connection, inside its transaction: several times faster per job. The first
    chunk is validated before any SQL runs. A COPY of more than one chunk validates each next chunk
    while the server stores the last (the two take about as long), inside a savepoint: a bad
    payload further on aborts the COPY, the savepoint is rolled back, and the transaction is as it
    was, with nothing written.
    """
    first = next(chunks, None)
    if first is None:
        return []
    opts = _exec_options(schema)
    conn = session.connection(bind_arguments=_JOB_BIND)
    driver = conn.connection.driver_connection
    queues = dict.fromkeys(first.queue)
    reserved = (
        conn.execute(
            _RESERVE_IDS, _reserve_params(count, run_at, delay, schema), execution_options=opts
        ).one()
        if count >= COPY_THRESHOLD and isinstance(driver, psycopg.Connection)
        else None
    )
    if reserved is not None and reserved.ids is not None and isinstance(driver, psycopg.Connection):
        ids: list[int] = sorted(reserved.ids)
        when = reserved.run_at
        sql = _copy_sql(schema)
        streamed = len(first) < count
        if streamed:
            conn.exec_driver_sql(_SAVEPOINT)
        try:
            with driver.cursor() as cur, cur.copy(sql) as copy:
                done = 0
                for batch in chain([first], chunks):
                    queues.update(dict.fromkeys(batch.queue))
                    for data in _copy_text(batch, ids[done : done + len(batch)], when):
                        copy.write(data)
                    done += len(batch)
        except EnqueueError:
            conn.exec_driver_sql(_ROLLBACK_TO_SAVEPOINT)
            conn.exec_driver_sql(_RELEASE_SAVEPOINT)
            raise
        except psycopg.Error as exc:
            error = _copy_error(conn.dialect, conn.connection.dbapi_connection, exc, sql)
            if error.connection_invalidated:
                conn.invalidate(exc)
            raise error from exc
        if streamed:
            conn.exec_driver_sql(_RELEASE_SAVEPOINT)
    else:
        for batch in chunks:
            first.absorb(batch)
            queues.update(dict.fromkeys(batch.queue))
        ids = list(
            conn.scalars(_INSERT_MANY, _many_params(first, run_at, delay), execution_options=opts)
        )
    for q in _queues_to_notify(session, queues):
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
    count: int,
    chunks: Iterator[Batch],
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    channel: str,
) -> list[int]:
    """:func:`enqueue_many` for an ``AsyncSession`` (COPY on psycopg's ``AsyncConnection``)."""
    first = next(chunks, None)
    if first is None:
        return []
    opts = _exec_options(schema)
    conn = await session.connection(bind_arguments=_JOB_BIND)
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    queues = dict.fromkeys(first.queue)
    row = (
        (
            await conn.execute(
                _RESERVE_IDS, _reserve_params(count, run_at, delay, schema), execution_options=opts
            )
        ).one()
        if count >= COPY_THRESHOLD and isinstance(driver, psycopg.AsyncConnection)
        else None
    )
    if row is not None and row.ids is not None and isinstance(driver, psycopg.AsyncConnection):
        ids: list[int] = sorted(row.ids)
        when = row.run_at
        sql = _copy_sql(schema)
        streamed = len(first) < count
        if streamed:
            await conn.exec_driver_sql(_SAVEPOINT)
        try:
            async with driver.cursor() as cur, cur.copy(sql) as copy:
                done = 0
                for batch in chain([first], chunks):
                    queues.update(dict.fromkeys(batch.queue))
                    for data in _copy_text(batch, ids[done : done + len(batch)], when):
                        await copy.write(data)
                    done += len(batch)
        except EnqueueError:
            await conn.exec_driver_sql(_ROLLBACK_TO_SAVEPOINT)
            await conn.exec_driver_sql(_RELEASE_SAVEPOINT)
            raise
        except psycopg.Error as exc:
            error = _copy_error(conn.dialect, raw.dbapi_connection, exc, sql)
            if error.connection_invalidated:
                await conn.invalidate(exc)
            raise error from exc
        if streamed:
            await conn.exec_driver_sql(_RELEASE_SAVEPOINT)
    else:
        for batch in chunks:
            first.absorb(batch)
            queues.update(dict.fromkeys(batch.queue))
        result = await conn.scalars(
            _INSERT_MANY, _many_params(first, run_at, delay), execution_options=opts
        )
        ids = list(result)
    for q in _queues_to_notify(session.sync_session, queues):
        await conn.execute(_NOTIFY, {"channel": channel, "queue": q}, execution_options=opts)
    return ids
