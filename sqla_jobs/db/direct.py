"""One statement of ours sent straight to the driver's cursor when nothing would see the
difference: the single enqueue's INSERT.

``Connection.execute`` builds an execution context, a cursor result and a row around every
statement, and that is about a third of the client CPU of a one-job transaction. When no event
listens on the connection, its engine or its dialect, the engine does not echo, the connection
sets no ``schema_translate_map`` of its own and the dialect is SQLAlchemy's own psycopg 3 one,
that work changes nothing anyone sees: the same string, compiled by that dialect, goes to the
same psycopg cursor with the same parameters. Otherwise (another driver or dialect included), the
statement goes through ``Connection.execute``, so instrumentation (OpenTelemetry, Sentry,
``echo``) still sees it. Statements passed here are module constants: their strings are kept.

An error is raised as ``Connection.execute`` raises it (a ``DBAPIError`` subclass; a lost
connection invalidated, with the pool), by SQLAlchemy's own handler.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, cast

import psycopg
from sqlalchemy import Connection, Dialect
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg, PGDialectAsync_psycopg
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import Executable
from sqlalchemy.util import await_only

#: Per dialect (one per engine), by (id of the statement, schema): the statement (kept, so that
#: its id is not reused) and the string it compiles to, or None for a statement whose parameters
#: or results SQLAlchemy would process (it goes through ``execute``).
_Compiled = dict[tuple[int, str | None], tuple[Executable, str | None]]
_compiled: weakref.WeakKeyDictionary[Dialect, _Compiled] = weakref.WeakKeyDictionary()


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
    return conn.execute(stmt, params, execution_options=exec_options(schema)).first()


def exec_options(schema: str | None) -> dict[str, Any]:
    """The execution options that put the job table in ``schema``."""
    return {} if schema is None else {"schema_translate_map": {None: schema}}


def _unobserved(conn: Connection) -> bool:
    """Whether ``conn.execute`` would run nothing but the driver's execute: no event, no echo, no
    schema translation of the connection's own (it would rename our table), and an active
    transaction (else ``execute`` raises, or begins one)."""
    if conn._has_events or conn.engine._has_events or conn.dialect._has_events or conn._echo:
        return False
    if "schema_translate_map" in conn._execution_options:
        return False
    transaction, nested = conn._transaction, conn._nested_transaction
    return (
        transaction is not None and transaction.is_active and (nested is None or nested.is_active)
    )


def _first(
    conn: Connection, driver: psycopg.Connection[Any], sql: str, params: dict[str, Any]
) -> Sequence[Any] | None:
    cursor = None
    try:
        cursor = driver.cursor()  # raises on a connection the server closed
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
    # In the AsyncSession's greenlet, as its own statements run (run_sync); SQLAlchemy 2.0's
    # adapter names its own await (await_fallback for an async_fallback engine).
    wait = getattr(conn.connection.dbapi_connection, "await_", await_only)
    try:
        return wait(_execute_async(driver, sql, params))
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
    found = per_dialect.get((id(stmt), schema))
    if found is None:
        found = per_dialect[(id(stmt), schema)] = (stmt, _compile(dialect, stmt, schema))
    return found[1]


def _compile(dialect: Dialect, stmt: Executable, schema: str | None) -> str | None:
    """``stmt`` as ``dialect`` sends it, the schema rendered in; None when ``execute`` would do
    more than send that string with the parameters as given and hand back the rows as they came:
    another dialect than SQLAlchemy's own psycopg ones (a subclass may execute its own way), or
    parameters positional, renamed, processed, expanded at execution or with values of their
    own, or a result processor."""
    if type(dialect) not in (PGDialect_psycopg, PGDialectAsync_psycopg):
        return None
    translate = exec_options(schema)
    compiled = stmt.compile(dialect=dialect, render_schema_translate=bool(translate), **translate)  # type: ignore[attr-defined]
    assert isinstance(compiled, SQLCompiler)
    if (
        compiled.positional
        or compiled.escaped_bind_names
        or compiled._bind_processors
        or compiled.literal_execute_params
        or compiled.post_compile_params
        or compiled.insert_prefetch
        or not all(bind.required for bind in compiled.binds.values())
    ):
        return None
    for column in compiled._result_columns:
        try:
            processor = column.type._cached_result_processor(dialect, None)
        except Exception:  # a type whose processor needs the column's type code: it has one
            return None
        if processor is not None:
            return None
    return compiled.string
