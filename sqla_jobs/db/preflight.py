"""Before a command touches the queue table: is it there, in the schema the command looks in, and
as new as this version of sqla-jobs needs?

Without this check a database that was never migrated surfaces as a 50-line traceback from the
first claim, after the worker has started its threads. The check reads the catalog only, so it
needs no privilege on the table and runs as any role that may connect.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from sqla_jobs.db.urls import parse_url, sqlalchemy_url
from sqla_jobs.errors import NotMigratedError
from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import tables as tables_sql

#: Every column the package reads or writes; a table without one of them predates a revision.
REQUIRED_COLUMNS = tuple(tables_sql.job.columns.keys())


def check_job_table(url: str, schema: str | None, select_schema: Callable[[str], str]) -> None:
    """Raise :class:`NotMigratedError` unless ``sqla_jobs_job`` exists where the queue's statements
    look for it (``schema``, or the search_path with None) and has every column the package uses.

    ``select_schema(name)`` phrases how the caller points at another schema (``--schema NAME`` for
    ``sqla-jobs stats``, ``Jobs(schema=...)`` for a worker); it is used when the table is found
    only in another schema. Takes no locks; database errors propagate unchanged.
    """
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(catalog_sql.find_job_tables(), {"schema": schema}).all()
    finally:
        engine.dispose()
    database = parse_url(url).database
    of_database = f' of database "{database}"' if database else ""
    where = f"the search_path{of_database}" if schema is None else f'schema "{schema}"{of_database}'
    if rows and rows[0].wanted:
        missing = [c for c in REQUIRED_COLUMNS if c not in rows[0].columns]
        if missing:
            raise NotMigratedError(
                f'the queue table "{rows[0].schema}".sqla_jobs_job is older than this version of '
                f"sqla-jobs needs (no column {', '.join(missing)})",
                f"to upgrade it, {_migrate(schema)}",
            )
        return
    if len(rows) == 1:
        raise NotMigratedError(
            f'no queue table sqla_jobs_job in {where}, but schema "{rows[0].schema}" has one',
            f"to use it, {select_schema(rows[0].schema)}",
        )
    if rows:
        others = ", ".join(f'"{r.schema}"' for r in rows)
        raise NotMigratedError(
            f"no queue table sqla_jobs_job in {where}, but schemas {others} have one",
            f"to use one, {select_schema(rows[0].schema)}, or name another of them",
        )
    raise NotMigratedError(
        f"no queue table sqla_jobs_job in {where}: the database is not migrated",
        f"to create it, {_migrate(schema)}",
    )


def _migrate(schema: str | None) -> str:
    if schema is None:
        return (
            "run `alembic upgrade heads` (if your application uses Alembic) or `sqla-jobs migrate`"
        )
    return (
        f"run `alembic -x sqla_jobs_schema={schema} upgrade heads` (if your application uses "
        f"Alembic) or `sqla-jobs migrate --schema {schema}`"
    )


def missing_queue_table(exc: BaseException, schema: str | None) -> NotMigratedError | None:
    """The library's error for ``exc`` if it is the server saying one of sqla-jobs' tables does
    not exist (undefined_table, 42P01, whose message names a ``sqla_jobs_`` relation), else None.
    Read from the error the statement already got: the enqueue path never probes the catalog."""
    cause = getattr(exc, "orig", None) or exc
    code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if code != "42P01":
        return None
    # The server's own message, not str(cause): that one quotes the statement, which names
    # sqla-jobs' tables whatever relation is missing.
    diag = getattr(cause, "diag", None)
    primary = getattr(diag, "message_primary", None) or str(cause).splitlines()[0]
    missing = _MISSING.search(primary)
    if missing is None:
        return None
    where = "the search_path" if schema is None else f'schema "{schema}"'
    return NotMigratedError(
        f"no table {missing.group(1)} in {where}: the database is not migrated for sqla-jobs, "
        "and this transaction is aborted (roll it back)",
        f"to create it, {_migrate(schema)}",
    )


#: The relation an undefined_table message names, when it is one of sqla-jobs'.
_MISSING = re.compile(r'relation "(?:[^"]+\.)?(sqla_jobs_\w+)" does not exist')
