"""Before a worker that runs handlers taking a Session starts: may those Sessions complete their
jobs (else it refuses to start, naming the grants), and does an application's foreign key to the
job table make completions need a savepoint (:mod:`~sqla_jobs.worker.session_runs`)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.pool import NullPool

from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.kinds import Kind
from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import tables as tables_sql
from sqla_jobs.worker.session_runs import SessionRuns


async def check_sessions(runs: SessionRuns, kinds: Iterable[Kind]) -> None:
    """Check the Sessions of ``kinds`` (sync ones in a thread), then look for foreign keys."""
    flavours = {inspect.iscoroutinefunction(k.handler) for k in kinds}
    if False in flavours:
        await asyncio.to_thread(_check_sync, runs)
    if True in flavours:
        await _check_async(runs)
    runs.savepoint, runs.deferred = await asyncio.to_thread(_foreign_keys, runs)


def _check_sync(runs: SessionRuns) -> None:
    with runs.sync_maker()() as session:
        try:
            row = session.execute(*_privileges(runs)).one()
        except ProgrammingError as exc:  # no USAGE on the schema: the names cannot resolve
            raise _refusal(runs, "sync", _first(exc)) from None
    _refuse(runs, row, "sync")


async def _check_async(runs: SessionRuns) -> None:
    async with runs.async_maker()() as session:
        try:
            row = (await session.execute(*_privileges(runs))).one()
        except ProgrammingError as exc:
            raise _refusal(runs, "async", _first(exc)) from None
    _refuse(runs, row, "async")


def _privileges(runs: SessionRuns) -> tuple[Any, dict[str, str]]:
    return catalog_sql.completion_privileges(), {
        "job_table": tables_sql.job_table_name(runs.schema),
        "history_table": tables_sql.history_table_name(runs.schema),
    }


def _refuse(runs: SessionRuns, row: Any, flavour: str) -> None:
    if not (row.complete and (row.history or not runs.keep_history)):
        raise _refusal(runs, flavour, "")


def _refusal(runs: SessionRuns, flavour: str, detail: str) -> ConfigurationError:
    needs = "USAGE on the schema, SELECT and DELETE on sqla_jobs_job" + (
        " and INSERT on sqla_jobs_history" if runs.keep_history else ""
    )
    return ConfigurationError(
        f"the {flavour} handlers that take a Session complete their jobs in that Session's "
        f"transaction, but its database role may not ({detail or 'missing grants'}): it needs "
        f"{needs}; grant them as docs/roles.md says (Handlers that take a Session), or give "
        "the worker another sessionmaker"
    )


def _first(exc: ProgrammingError) -> str:
    return str(exc.orig or exc).strip().splitlines()[0]


def _foreign_keys(runs: SessionRuns) -> tuple[bool, bool]:
    """Whether a foreign key may refuse a job's delete, and whether a check on the job table
    waits for the commit (``INITIALLY DEFERRED``)."""
    # Catalog only, on a connection of its own: the application's maker may be async.
    engine = create_engine(sqlalchemy_url(runs.url), poolclass=NullPool)
    table = {"job_table": tables_sql.job_table_name(runs.schema)}
    try:
        with engine.connect() as conn:
            blocking = conn.execute(catalog_sql.blocking_foreign_keys(), table).scalar_one()
            deferred = conn.execute(catalog_sql.deferred_job_triggers(), table).scalar_one()
            return bool(blocking), bool(deferred)
    finally:
        engine.dispose()
