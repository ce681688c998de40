"""Enqueue into the caller's ``Session`` (sync) or ``AsyncSession``: never a connection of our own,
never a commit. The job exists if and only if the caller's transaction commits.

The input arrives checked (:mod:`sqla_jobs.enqueue.validate`): nothing here raises for bad input, and the
statements come from :mod:`sqla_jobs.sql.enqueue`.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from itertools import chain
from typing import Any, cast

import psycopg
from sqlalchemy import Connection, Dialect, inspect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Mapper, Session, configure_mappers
from sqlalchemy.orm.attributes import instance_state

from sqla_jobs.db import direct
from sqla_jobs.enqueue import copy_rows as _copy
from sqla_jobs.enqueue import due as _due
from sqla_jobs.enqueue import row as _row
from sqla_jobs.enqueue import wakeup as _notify
from sqla_jobs.enqueue.row import Batch, Prepared
from sqla_jobs.enqueue.wakeup import Wakeup
from sqla_jobs.errors import EnqueueError
from sqla_jobs.model import ENQUEUED, Job
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import tables as tables_sql

_NOTIFIED_KEY = "sqla_jobs.notified"
_INSERT_ONE = enqueue_sql.insert_job()
_INSERT_ONE_NOTIFY = enqueue_sql.insert_job_and_notify()
# Without the optional columns (meta, rate_key), for a job that has none (see
# _row.Column.optional).
_INSERT_ONE_LEAN = enqueue_sql.insert_job(lean=True)
_INSERT_ONE_NOTIFY_LEAN = enqueue_sql.insert_job_and_notify(lean=True)
_INSERT_MANY = enqueue_sql.insert_jobs()
_RESERVE_IDS = enqueue_sql.reserve_job_ids()
_NOTIFY = enqueue_sql.notify()
_JOB_MAPPER: Mapper[Job] = inspect(Job)
_JOB_BIND = {"mapper": _JOB_MAPPER}
#: Below this many jobs enqueue_many sends one INSERT; from it on, it reserves ids and COPYs.
COPY_THRESHOLD = 64
_ONE_US = timedelta(microseconds=1)
_SAVEPOINT, _ROLLBACK_TO_SAVEPOINT, _RELEASE_SAVEPOINT = enqueue_sql.COPY_SAVEPOINT
#: Payloads validated at a time by enqueue_many, while the server stores the previous ones.
CHUNK = 1024


def _one_params(values: list[Any], run_at: datetime | None, delay: timedelta) -> dict[str, Any]:
    params = dict(zip(_row.NAMES, values, strict=True))
    params["run_at"] = run_at
    params["delay_us"] = delay // _ONE_US
    return params


def _many_params(batch: Batch, run_at: datetime | None, delay: timedelta) -> dict[str, Any]:
    params: dict[str, Any] = {
        c.array: values for c, values in zip(_row.COLUMNS, batch.columns, strict=True)
    }
    params["run_at"] = run_at
    params["delay_us"] = delay // _ONE_US
    return params


def _notified(session: Session) -> set[str]:
    """The queues already woken (or planned to be) in the session's current (innermost)
    transaction: one wakeup per queue and transaction is enough. Keyed on the innermost
    transaction, so a rolled-back savepoint (whose wakeups are discarded with it) cannot suppress
    the outer transaction's. Before the session has begun a transaction there is none, and
    nothing has been woken.
    """
    tx = session.get_nested_transaction() or session.get_transaction()
    if tx is None:
        return set()
    seen = session.info.get(_NOTIFIED_KEY)
    if seen is None or seen[0]() is not tx:
        # A weak reference: the transaction refers to the Session, whose info would hold it
        # back, a cycle that left every enqueuing Session to the cyclic garbage collector.
        seen = (weakref.ref(tx), set[str]())
        session.info[_NOTIFIED_KEY] = seen
    notified: set[str] = seen[1]
    return notified


def wake(
    session: Session,
    conn: Connection,
    wakeup: Wakeup,
    queues: Iterable[str],
    due_now: bool,
    options: dict[str, Any],
) -> None:
    """Wake ``queues`` as ``wakeup``'s mode says (see :mod:`sqla_jobs.enqueue.wakeup`), for jobs just
    inserted on ``conn``, once per queue and transaction; nothing for jobs not due yet."""
    if not due_now:
        return
    seen = _notified(session)
    fresh = [q for q in dict.fromkeys(queues) if q not in seen]
    seen.update(fresh)
    for q in wakeup.plan(session, fresh) if fresh else ():
        conn.execute(_NOTIFY, {"channel": wakeup.channel, "queue": q}, execution_options=options)


def _insert_one(
    session: Session,
    job: Prepared,
    values: list[Any],
    run_at: datetime | None,
    delay: timedelta,
    wakeup: Wakeup,
) -> tuple[Any, dict[str, Any]]:
    """The statement and parameters for one job (``values``: ``job.values()``): with the wakeup
    folded in when it rides the transaction (see :mod:`sqla_jobs.enqueue.wakeup`) and this
    transaction has not sent it yet."""
    params = _one_params(values, run_at, delay)
    lean = all(params[name] is None for name in _row.OPTIONAL)
    if lean:
        # A parameter named after a column adds that column to the INSERT: leave it out.
        for name in _row.OPTIONAL:
            del params[name]
    seen = _notified(session)
    if job.queue not in seen and _notify.due_now(run_at, params["delay_us"]):
        seen.add(job.queue)
        if wakeup.plan(session, [job.queue]):
            stmt = _INSERT_ONE_NOTIFY_LEAN if lean else _INSERT_ONE_NOTIFY
            return stmt, {**params, "channel": wakeup.channel, "queue_name": job.queue}
    elif run_at is not None or params["delay_us"] > 0:
        _due.announce(session, wakeup, [job.queue], run_at, params["delay_us"])
    return _INSERT_ONE_LEAN if lean else _INSERT_ONE, params


def _attach(session: Session, values: list[Any], filled: Sequence[Any]) -> Job:
    """The inserted job as a persistent ``Job`` in ``session``, without loading it back: the
    database's values (``filled``: :data:`enqueue_sql.FILLED_COLUMNS`, and
    :data:`enqueue_sql.NEW_ROW_DEFAULTS`) plus what was bound
    (``values``: the job's, in :data:`_row.NAMES` order; its JSON texts are parsed in place). This is
    what an ORM load of the RETURNING row would give, at a fraction of the cost on the hot path.

    The object's state is built as a load builds it (every column attribute in its ``__dict__``,
    nothing modified, the identity key set: what ``make_transient_to_detached`` makes of it), and
    it is attached as ``Session.add`` attaches a detached object (same events), without the
    cascade walk (``Job`` has no relationships)."""
    if not _configured:
        _configure()
    obj = _new_instance()
    d = obj.__dict__
    d.update(_NEW_ROW)
    d.update(zip(_FILLED_KEYS, filled, strict=True))
    for i in _JSON_AT:
        if values[i] is not None:
            values[i] = json.loads(values[i])
    d.update(zip(_row.NAMES, values, strict=True))
    d[ENQUEUED] = "inserted"
    state = instance_state(obj)
    state.key = (_IDENTITY_CLASS, (filled[0],), None)
    session._update_impl(state)
    # Registered as inserted by the innermost transaction, as a flush registers an object it
    # inserts: a rollback of that transaction (or of the savepoint) then makes it transient, as it
    # does the Session's own inserts. Added as a detached object, it would stay persistent after
    # the rollback, refreshing from a row that no longer exists (ObjectDeletedError).
    tx = session._transaction
    if tx is not None:
        tx._new[state] = True
    return obj


_FILLED_KEYS = tuple(c.key for c in enqueue_sql.FILLED_COLUMNS)
_JSON_AT = tuple(i for i, c in enumerate(_row.COLUMNS) if c.json)
#: The columns neither written nor returned by the insert, as a new row has them: the server
#: defaults of NEW_ROW_DEFAULTS, NULL for the rest; set so that reading them does not load the row.
_NEW_ROW = {
    **dict.fromkeys(
        c.key for c in _JOB_MAPPER.column_attrs if c.key not in {*_FILLED_KEYS, *_row.NAMES}
    ),
    **enqueue_sql.NEW_ROW_DEFAULTS,
}
_new_instance = _JOB_MAPPER.class_manager.new_instance
_IDENTITY_CLASS = _JOB_MAPPER._identity_class
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
        "table": tables_sql.job_table_name(schema),
        "n": count,
        "run_at": run_at,
        "delay_us": delay // _ONE_US,
    }


@functools.cache
def _copy_sql(schema: str | None) -> str:
    return enqueue_sql.copy_jobs(schema).text


def enqueue(
    session: Session,
    job: Prepared,
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    wakeup: Wakeup,
) -> Job:
    """Insert one prepared job through ``session`` and queue its wakeup; returns the ``Job``.
    The async calls run it too, in the ``AsyncSession``'s greenlet
    (:mod:`~sqla_jobs.enqueue.dispatch`)."""
    conn = session.connection(bind_arguments=_JOB_BIND)
    values = job.values()
    stmt, params = _insert_one(session, job, values, run_at, delay, wakeup)
    filled = direct.first(conn, stmt, params, schema)
    assert filled is not None
    return _attach(session, values, filled)


def enqueue_many(
    session: Session,
    count: int,
    chunks: Iterator[Batch],
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    wakeup: Wakeup,
) -> list[int]:
    """Insert ``count`` jobs, validated a chunk at a time by ``chunks``, through ``session``;
    returns the ids in payload order.

    Small batches are one ``INSERT ... SELECT FROM unnest(...)``. From :data:`COPY_THRESHOLD` jobs
    on, on psycopg 3, the ids are reserved in one statement and the rows sent by ``COPY`` on the
    session's own connection, inside its transaction: several times faster per job. The first
    chunk is validated before any SQL runs. A COPY of more than one chunk validates each next chunk
    while the server stores the last (the two take about as long), inside a savepoint: a bad
    payload further on aborts the COPY, the savepoint is rolled back, and the transaction is as it
    was, with nothing written. A role that may not take ids from the sequence gets the INSERT.
    The async calls run it too, in the ``AsyncSession``'s greenlet (COPY on psycopg's
    ``AsyncConnection``; see :mod:`~sqla_jobs.enqueue.dispatch`).
    """
    first = next(chunks, None)
    if first is None:
        return []
    opts = direct.exec_options(schema)
    conn = session.connection(bind_arguments=_JOB_BIND)
    queues = dict.fromkeys(first.column("queue"))
    ids = None
    if count >= COPY_THRESHOLD and isinstance(
        conn.connection.driver_connection, (psycopg.Connection, psycopg.AsyncConnection)
    ):
        reserved = conn.execute(
            _RESERVE_IDS, _reserve_params(count, run_at, delay, schema), execution_options=opts
        ).one()
        if reserved.ids is not None:
            ids = sorted(reserved.ids)
            streamed = len(first) < count
            _copy_rows(conn, first, chunks, ids, reserved.run_at, streamed, schema, queues)
    if ids is None:
        for batch in chunks:
            first.absorb(batch)
            queues.update(dict.fromkeys(batch.column("queue")))
        ids = list(
            conn.scalars(_INSERT_MANY, _many_params(first, run_at, delay), execution_options=opts)
        )
    due_now = _notify.due_now(run_at, delay // _ONE_US)
    wake(session, conn, wakeup, queues, due_now, opts)
    if not due_now:
        _due.announce(session, wakeup, list(queues), run_at, delay // _ONE_US)
    return ids


def _copy_rows(
    conn: Connection,
    first: Batch,
    chunks: Iterator[Batch],
    ids: list[int],
    when: datetime,
    streamed: bool,
    schema: str | None,
    queues: dict[str, None],
) -> None:
    """COPY ``first`` and the rest of ``chunks`` under the reserved ``ids``; with ``streamed``,
    inside a savepoint that a bad payload of a later chunk rolls back. Adds the later chunks'
    queues to ``queues`` (for the wakeups)."""
    sql = _copy_sql(schema)
    if streamed:
        conn.exec_driver_sql(_SAVEPOINT)

    def data() -> Iterator[str]:
        done = 0
        for batch in chain([first], chunks):
            queues.update(dict.fromkeys(batch.column("queue")))
            yield from _copy.text(batch, ids[done : done + len(batch)], when)
            done += len(batch)

    try:
        _copy.copy(conn.connection.driver_connection, sql, data())
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
