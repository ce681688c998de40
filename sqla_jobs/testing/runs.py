"""Running jobs inline for :mod:`sqla_jobs.testing`: the worker's claims, outcome rules and
completion, inside the test's transaction.

One core for both shells. ``run_jobs`` calls it with the test's ``Session``; ``run_jobs_async``
calls it through ``AsyncSession.run_sync``, whose greenlet lets the same synchronous code drive
an async driver, and hands it ``await_only`` to await async handlers with.

A handler that takes a session gets one joined to the test's transaction by a SAVEPOINT; its
job's completion runs in that savepoint, fenced on the lease as the worker's runs in the
handler's transaction, so both are released together or rolled back together.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from sqla_jobs._outcome import Outcome, encode_result, failed, resolve, snoozed
from sqla_jobs.context import ClaimedJob, JobContext, Snooze
from sqla_jobs.errors import ConfigurationError, LeaseLostError
from sqla_jobs.jobs import Jobs
from sqla_jobs.kinds import Kind
from sqla_jobs.model import JobState
from sqla_jobs.sql import claim as claim_sql
from sqla_jobs.sql import scans as scans_sql
from sqla_jobs.sql import testing as testing_sql
from sqla_jobs.sql.compiled import Compiled, WorkerSQL, compile_statement
from sqla_jobs.worker.writes import outcome_statement

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

_LEASE = timedelta(minutes=5)
_ONE_US = timedelta(microseconds=1)


class JobFailed(Exception):
    """A job :func:`~sqla_jobs.testing.run_jobs` ran did not complete, for a reason other than its
    handler's own exception (an unknown kind, a payload that no longer validates): the outcome's
    error."""


@dataclass
class RunResult:
    """What :func:`~sqla_jobs.testing.run_jobs` did: how many jobs completed, failed (to be
    retried), went dead or snoozed, and the errors (handlers' exceptions, :class:`JobFailed`, a
    :class:`~sqla_jobs.LeaseLostError` whose run was rolled back)."""

    done: int = 0
    failed: int = 0
    dead: int = 0
    snoozed: int = 0
    errors: list[BaseException] = field(default_factory=list)


@dataclass(frozen=True)
class Scope:
    """Which jobs one run claims: see :func:`~sqla_jobs.testing.run_jobs`."""

    queues: list[str] | None = None
    limit: int = 1000
    raise_errors: bool = True
    all_jobs: bool = False
    include_delayed: bool = False
    until: timedelta | float | None = None

    def params(self) -> dict[str, Any]:
        """The testing claims' selection parameters."""
        until = self.until or 0
        ahead = until if isinstance(until, timedelta) else timedelta(seconds=until)
        if ahead < timedelta(0):
            raise ValueError(f"until must be >= 0 (time only moves forward), got {self.until!r}")
        return {
            "all_jobs": self.all_jobs,
            "delayed": self.include_delayed,
            "ahead_us": ahead // _ONE_US,
        }


@dataclass(frozen=True)
class Shell:
    """What differs between the sync and the async shell."""

    #: Runs an awaitable to its end: ``asyncio.run`` (sync), or ``await_only`` (async).
    wait: Callable[[Awaitable[Any]], Any]
    #: The test's connection as an ``AsyncConnection`` (async shell only), for the handlers that
    #: take an ``AsyncSession``, and the loop it lives on.
    async_conn: AsyncConnection | None = None
    loop: asyncio.AbstractEventLoop | None = None


class _SQL:
    """The worker's statements, and the testing claims, compiled for one schema."""

    def __init__(self, schema: str | None) -> None:
        self.worker = WorkerSQL(schema)
        self.claim = compile_statement(claim_sql.claim_for_testing(), schema)
        self.lock_keys = compile_statement(scans_sql.lock_keys_for_testing(), schema)
        self.claim_keyed = compile_statement(claim_sql.claim_keyed_for_testing(), schema)
        self.unsettled = compile_statement(testing_sql.count_unsettled(), schema)
        self.settle = testing_sql.settle_dependencies(schema)


@functools.lru_cache(maxsize=8)
def _compiled(schema: str | None) -> _SQL:
    # Compiling some twenty statements costs milliseconds: a suite calls run_jobs in most tests.
    return _SQL(schema)


def run(jobs: Jobs, session: Session, scope: Scope, shell: Shell) -> RunResult:
    """Claim the jobs ``scope`` selects, run their handlers, write their outcomes: all on
    ``session``'s connection, inside its transaction. Passes over the queues until one ends no
    parent: each settles the children of the parents it ended (as their commit would), so the
    next pass runs those released, and a graph runs in dependency order in one call."""
    selection = scope.params()
    sql = _compiled(jobs.schema)
    result = RunResult()
    session.flush()
    conn = session.connection()
    runner = _Runner(jobs, conn, sql.worker, shell, result)
    # The edges the test enqueued are checked as their commit would: a parent may have ended.
    _settle(conn, sql)
    while _one_pass(jobs, session, scope, selection, sql, runner, result):
        if not _execute(conn, sql.unsettled).scalar():
            break
        _settle(conn, sql)
    return result


def _settle(conn: Connection, sql: _SQL) -> None:
    for statement in sql.settle:
        conn.exec_driver_sql(statement)


def _one_pass(
    jobs: Jobs,
    session: Session,
    scope: Scope,
    selection: dict[str, Any],
    sql: _SQL,
    runner: _Runner,
    result: RunResult,
) -> bool:
    """One claim per queue and its runs; whether it ran any job."""
    conn = session.connection()
    ran = False
    for queue in scope.queues or jobs.queues():
        claim = {"queue": queue, "limit": scope.limit, "lease": _LEASE, "worker": "testing"}
        rows = _execute(conn, sql.claim, **claim, **selection).all()
        # Keyed jobs too, within their limits, as a worker would claim them.
        scan = {"queue": queue, "scan": scope.limit}
        keys = [r[0] for r in _execute(conn, sql.lock_keys, **scan, **selection).all()]
        if keys:
            rows += _execute(conn, sql.claim_keyed, keys=keys, **claim, **selection).all()
        for row in rows:
            error = runner.run_one(ClaimedJob(*row))
            if error is not None:
                result.errors.append(error)
                if scope.raise_errors:
                    # The children of a parent that just went dead are cancelled before it raises.
                    _settle(conn, sql)
                    _expire(session)
                    raise error
        if rows:
            ran = True
            _expire(session)
    return ran


def _expire(session: Session) -> None:
    # The handlers wrote through other sessions: what this one loaded may be stale. Expire it as
    # its own commit would (an AsyncSession's user has usually turned that off, rightly).
    if session.expire_on_commit:
        session.expire_all()


def _execute(conn: Connection, stmt: Compiled, **params: Any) -> Any:
    return conn.exec_driver_sql(stmt.sql, stmt.params(**params))


class _Runner:
    """Runs claimed jobs one by one and writes their outcomes, counting them in ``result``."""

    def __init__(
        self, jobs: Jobs, conn: Connection, sql: WorkerSQL, shell: Shell, result: RunResult
    ) -> None:
        self._jobs = jobs
        self._conn = conn
        self._sql = sql
        self._shell = shell
        self._result = result
        self._thread = threading.get_ident()

    def run_one(self, job: ClaimedJob) -> BaseException | None:
        """Run ``job`` and write its outcome; the error to report, if it did not complete."""
        resolved = resolve(self._jobs, job)
        if isinstance(resolved, Outcome):
            self._write(resolved)
            return JobFailed(f"job {job.id} ({job.kind}): {resolved.error}")
        kind, args = resolved
        ctx = JobContext.for_job(job, "testing", self._record, reader=self._parent_results)
        error: BaseException | None = None
        session = self._session_for(kind) if kind.wants_session else None
        try:
            if session is not None:
                self._run_in_savepoint(kind, args, ctx, job, session)
            else:
                value: Any = kind.handler(args, ctx)  # type: ignore[misc]
                if inspect.isawaitable(value):
                    value = self._shell.wait(value)
                stored = encode_result(job.id, job.kind, value) if kind.options.results else None
        except Snooze as exc:
            outcome = snoozed(job, exc)
        except LeaseLostError as exc:
            if kind.wants_session:
                return exc  # rolled back, and no outcome: as in the worker, the job is not ours
            outcome, error = failed(job, kind, exc), exc
        except Exception as exc:
            outcome, error = failed(job, kind, exc), exc
        else:
            if session is None:
                self._complete(self._conn, job, stored)
            self._result.done += 1
            return None
        self._write(outcome)
        return error

    def _session_for(self, kind: Kind) -> Session | AsyncSession:
        """The session a handler of ``kind`` takes, joined to the test's transaction (its
        SAVEPOINT begins at first use): a ``Session``, or an ``AsyncSession`` for an async
        handler, which only the async shell can give."""
        if not inspect.iscoroutinefunction(kind.handler):
            return Session(bind=self._conn, join_transaction_mode="create_savepoint")
        if self._shell.async_conn is None:
            raise ConfigurationError(
                f"kind {kind.name!r}: its async handler takes an AsyncSession, which a sync "
                "Session cannot give; run it with `await testing.run_jobs_async(jobs, session)`"
            )
        from sqlalchemy.ext.asyncio import AsyncSession

        return AsyncSession(bind=self._shell.async_conn, join_transaction_mode="create_savepoint")

    def _run_in_savepoint(
        self, kind: Kind, args: Any, ctx: JobContext, job: ClaimedJob, given: Session | AsyncSession
    ) -> None:
        """Run a handler that takes a session, and complete its job in that session's SAVEPOINT;
        any exception rolls both back to the savepoint."""
        handler = kind.handler
        assert handler is not None
        # Driven synchronously in both shells (in the async one, from run_sync's greenlet).
        session = given if isinstance(given, Session) else given.sync_session
        ctx.in_session = True
        try:
            value = handler(args, ctx, given)
            if inspect.isawaitable(value):
                value = self._shell.wait(value)
            stored = encode_result(job.id, job.kind, value) if kind.options.results else None
            session.flush()
            done = self._complete(session.connection(), job, stored).first()
            if done is None:
                raise LeaseLostError(
                    f"job {job.id}: lease lost before its completion; the handler's writes "
                    "were rolled back"
                )
            session.commit()
        finally:
            # Rolls back to the savepoint whatever was not released: on any exception, the
            # handler's writes and the completion alike.
            session.close()

    def _write(self, outcome: Outcome) -> None:
        """Write an outcome other than a completion with the worker's statement, and count it."""
        statement, params = outcome_statement(self._sql, outcome)
        state = self._conn.exec_driver_sql(statement, params).first()
        if outcome.snooze_us is not None:
            self._result.snoozed += 1
        elif state is not None and state[0] == JobState.DEAD.value:
            self._result.dead += 1
        else:
            self._result.failed += 1

    def _complete(self, conn: Connection, job: ClaimedJob, stored: str | None) -> Any:
        # The worker's completion; with the result, for a kind that stores one.
        if stored is None:
            return _execute(conn, self._sql.complete, ids=[job.id], token=job.lease_token)
        return _execute(
            conn,
            self._sql.complete_with_results,
            ids=[job.id],
            token=job.lease_token,
            results=[stored],
        )

    def _parent_results(self, job_id: int) -> dict[int, Any]:
        """``ctx.parent_results``: read on the test's connection."""
        rows = self._run(self._sql.parent_results, {"child": job_id}).all()
        return {row[0]: json.loads(row[1]) for row in rows}

    def _record(self, job_id: int, token: uuid.UUID, name: str, value: str) -> bool:
        """Record a durable step on the test's connection (the worker's recorder, inline)."""
        compiled = self._sql.record_step
        params = compiled.params(id=job_id, token=token, name=name, value=value)
        return self._run(compiled, params).first() is not None

    def _run(self, compiled: Compiled, params: dict[str, Any]) -> Any:
        shell = self._shell
        if shell.async_conn is not None and threading.get_ident() != self._thread:
            # ``ctx.astep`` records from a thread, where the greenlet that lets this code drive
            # the async driver is not: run the statement on the loop, which waits for us.
            assert shell.loop is not None
            future = asyncio.run_coroutine_threadsafe(
                shell.async_conn.exec_driver_sql(compiled.sql, compiled.params(**params)),
                shell.loop,
            )
            return future.result()
        return self._conn.exec_driver_sql(compiled.sql, compiled.params(**params))
