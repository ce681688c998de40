"""One statement of ours sent straight to the driver's cursor when nothing would see the
difference: the single enqueue's INSERT.

``Connection.execute`` builds an execution context, a cursor result and a row around every
statement, and that is about a third of the client CPU of a one-job transaction. When no event
listens on the connection, its engine or its dialect, the engine does not echo, and the
connection sets no ``schema_translate_map`` of its own, that work changes nothing anyone sees:
the same string, compiled by the connection's own dialect, goes to the same psycopg cursor with
the same parameters. Otherwise, and on any driver but psycopg 3, the statement goes through
``Connection.execute``, so instrumentation (OpenTelemetry, Sentry, ``echo``) still sees it.

An error is raised as ``Connection.execute`` raises it (a ``DBAPIError`` subclass; a lost
connection invalidated, with the pool), by SQLAlchemy's own handler.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, cast

import psycopg
from sqlalchemy import Connection, Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import Executable
from sqlalchemy.util import await_only

#: Per dialect (one per engine): the string each (statement, schema) compiles to, or None for a
#: statement whose parameters or results SQLAlchemy would process (it goes through ``execute``).
_compiled: weakref.WeakKeyDictionary[Dialect, dict[tuple[int, str | None], str | None]] = (
    weakref.WeakKeyDictionary()
)


def first(
    conn: Connection, stmt: Executable, params: dict[str, Any], schema: str | None
) -> Sequence[Any] | None:
    """The first row of ``stmt`` (a statement of :mod:`sqla_jobs.sql` of the job table in
    ``schema``) run with ``params`` on ``conn``, as ``conn.execute(...).first()`` returns it."""
    if _unobserved(conn):
        sql = _sql(conn.dialect, stmt, schema)
        driver = conn.connection.driver_connection
        if sql is not None and isinstance(driver, psycopg.Connection):
            return _first(conn, driver, sql, params)
        if sql is not None and isinstance(driver, psycopg.AsyncConnection):
            return _first_async(conn, driver, sql, params)
    options = {} if schema is None else {"schema_translate_map": {None: schema}}
    return conn.execute(stmt, params, execution_options=options).first()


def _unobserved(conn: Connection) -> bool:
    """Whether ``conn.execute`` would run nothing but the driver's execute: no event, no echo,
    and no schema translation of the connection's own (it would rename our table)."""
    if conn._has_events or conn.engine._has_events or conn.dialect._has_events or conn._echo:
        return False
    return "schema_translate_map" not in conn._execution_options


def _first(
    conn: Connection, driver: psycopg.Connection[Any], sql: str, params: dict[str, Any]
) -> Sequence[Any] | None:
    cursor = driver.cursor()
    try:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    except BaseException as exc:
        # SQLAlchemy's own handling: the error wrapped, a disconnect invalidating the connection
        # (and the pool), the cursor closed.
        conn._handle_dbapi_exception(exc, sql, params, cast(Any, cursor), None)
    cursor.close()
    return row


def _first_async(
    conn: Connection, driver: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any]
) -> Sequence[Any] | None:
    try:
        # In the AsyncSession's greenlet, as its own statements run (run_sync).
        return await_only(_execute_async(driver, sql, params))
    except BaseException as exc:
        conn._handle_dbapi_exception(exc, sql, params, None, None)


async def _execute_async(
    driver: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any]
) -> Sequence[Any] | None:
    async with driver.cursor() as cursor:
        await cursor.execute(sql, params)
        return await cursor.fetchone()


def _sql(dialect: Dialect, stmt: Executable, schema: str | None) -> str | None:
    per_dialect = _compiled.get(dialect)
    if per_dialect is None:
        per_dialect = _compiled[dialect] = {}
    key = (id(stmt), schema)
    if key not in per_dialect:
        per_dialect[key] = _compile(dialect, stmt, schema)
    return per_dialect[key]


def _compile(dialect: Dialect, stmt: Executable, schema: str | None) -> str | None:
    """``stmt`` as ``dialect`` sends it, the schema rendered in; None when the driver would not
    get the parameters as given (positional, renamed, processed, or with values of their own)
    or the rows as returned (a result processor)."""
    translate = {} if schema is None else {"schema_translate_map": {None: schema}}
    compiled = stmt.compile(dialect=dialect, render_schema_translate=bool(translate), **translate)  # type: ignore[attr-defined]
    assert isinstance(compiled, SQLCompiler)
    if (
        compiled.positional
        or compiled.escaped_bind_names
        or compiled._bind_processors
        or not all(bind.required for bind in compiled.binds.values())
    ):
        return None
    for column in compiled._result_columns:
        if column.type._cached_result_processor(dialect, None) is not None:
            return None
    return compiled.string
