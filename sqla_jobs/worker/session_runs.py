"""Handlers that take a Session: their writes and their job's completion commit together.

A kind whose handler is ``(payload, ctx, session)`` gets a Session from the application's
sessionmaker (an ``AsyncSession`` from an ``async_sessionmaker`` for an async handler; without
one, a maker on the worker's own URL). The handler runs inside ``session.begin()``; when it
returns, the job's completion (the worker's own fenced DELETE, or its copy into history) runs in
that same transaction, and the commit makes both durable or neither. If the lease was lost
meanwhile, the completion finds no row and the whole transaction rolls back: the job's new owner
runs it, and the application's tables see its effects once.

A completion that an application's foreign key refuses (``NO ACTION`` or ``RESTRICT`` on a key
pointing at the job) would abort the handler's transaction; where such keys exist the DELETE runs
in a savepoint and, refused, the job is kept ``completed`` instead, in the same transaction.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

from sqla_jobs._outcome import HandlerTimeout, encode_result
from sqla_jobs.context import ClaimedJob, JobContext
from sqla_jobs.db.failover import failover_safe
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.errors import ConfigurationError, LeaseLostError
from sqla_jobs.kinds import Kind
from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import outcomes as outcomes_sql
from sqla_jobs.sql import results as results_sql

log = logging.getLogger("sqla_jobs.worker")

_IMMEDIATE = text(catalog_sql.IMMEDIATE_CONSTRAINTS)

#: What ``Worker(sessionmaker=...)`` accepts.
AnyMaker = sessionmaker[Session] | async_sessionmaker[AsyncSession] | Engine | AsyncEngine


class CompletionRefused(Exception):
    """A foreign key created since the worker started refused the completion's DELETE: the
    transaction is lost, the run fails, and its retry completes in a savepoint."""


class SessionRuns:
    """Runs the handlers of kinds that take a Session, for one worker."""

    def __init__(
        self,
        *,
        url: str,
        schema: str | None,
        keep_history: bool,
        maker: AnyMaker | None,
        pool_size: int,
        warn_after: float,
    ) -> None:
        self.url = url
        self.schema = schema
        self.keep_history = keep_history
        self._pool_size = pool_size
        self.warn_after = warn_after
        self._sync: sessionmaker[Session] | None = None
        self._async: async_sessionmaker[AsyncSession] | None = None
        if isinstance(maker, async_sessionmaker):
            self._async = maker
        elif isinstance(maker, AsyncEngine):
            self._async = async_sessionmaker(maker)
        elif isinstance(maker, sessionmaker):
            self._sync = maker
        elif isinstance(maker, Engine):
            self._sync = sessionmaker(maker)
        elif maker is not None:
            raise ConfigurationError(
                "sessionmaker must be a sessionmaker, an async_sessionmaker or an engine (sync or "
                f"async), got {type(maker).__name__}"
            )
        # Engines built here from the worker's URL, disposed at the worker's end.
        self._owned: list[Engine | AsyncEngine] = []
        self._options: dict[str, Any] = (
            {} if schema is None else {"schema_translate_map": {None: schema}}
        )
        self._complete = (
            outcomes_sql.complete_into_history() if keep_history else outcomes_sql.complete()
        )
        self._complete_results = (
            results_sql.complete_into_history_with_results()
            if keep_history
            else results_sql.complete_with_results()
        )
        self._keep = outcomes_sql.keep_completed_in_session()
        self._keep_result = results_sql.keep_completed_with_result()
        #: Whether a foreign key may refuse the DELETE (then it runs in a savepoint).
        self.savepoint = False
        #: Whether such a key is checked only at commit: then checked at the DELETE instead, so
        #: that a refusal keeps the job rather than losing the handler's transaction.
        self.deferred = False

    # -- makers ------------------------------------------------------------------------------------

    def sync_maker(self) -> sessionmaker[Session]:
        if self._sync is None:
            engine = failover_safe(
                create_engine(sqlalchemy_url(self.url), pool_size=self._pool_size)
            )
            self._owned.append(engine)
            self._sync = sessionmaker(engine)
        return self._sync

    def async_maker(self) -> async_sessionmaker[AsyncSession]:
        if self._async is None:
            engine = failover_safe(
                create_async_engine(sqlalchemy_url(self.url), pool_size=self._pool_size)
            )
            self._owned.append(engine)
            self._async = async_sessionmaker(engine)
        return self._async

    async def close(self) -> None:
        """Dispose of the engines this built (the application's own are left to it)."""
        for engine in self._owned:
            if isinstance(engine, AsyncEngine):
                await engine.dispose()
            else:
                engine.dispose()
        self._owned.clear()

    # -- runs --------------------------------------------------------------------------------------

    def sync_call(
        self, kind: Kind, args: Any, ctx: JobContext, job: ClaimedJob
    ) -> Callable[[], Any]:
        """The call a runner thread makes for a sync handler: run it and complete its job in one
        transaction."""
        handler = kind.handler
        assert handler is not None

        def call() -> None:
            with self.sync_maker()() as session:
                completed = False
                try:
                    with session.begin():
                        value = handler(args, ctx, session)
                        _check_deadline(ctx)
                        self._complete_sync(session, job, _result(kind, job, value))
                        completed = True
                except IntegrityError as exc:
                    if completed:  # at the commit: a check deferred to it refused
                        raise self._refused_at_commit(exc) from None
                    raise

        return call

    async def async_call(self, kind: Kind, args: Any, ctx: JobContext, job: ClaimedJob) -> None:
        """Run an async handler and complete its job in one transaction (a cancellation, at its
        timeout or an operator's cancel, rolls both back)."""
        handler = kind.handler
        assert handler is not None
        async with self.async_maker()() as session:
            completed = False
            try:
                async with session.begin():
                    value = handler(args, ctx, session)
                    if inspect.isawaitable(value):
                        value = await value
                    await self._complete_async(session, job, _result(kind, job, value))
                    completed = True
            except IntegrityError as exc:
                if completed:
                    raise self._refused_at_commit(exc) from None
                raise

    def _refused_at_commit(self, exc: IntegrityError) -> CompletionRefused:
        # From now on such checks run at the DELETE, in its savepoint: the retry keeps the job.
        self.deferred = self.savepoint = True
        return CompletionRefused(_refused(exc))

    def watch(self, job: ClaimedJob) -> asyncio.TimerHandle:
        """Warn once if ``job``'s transaction stays open past :attr:`warn_after`."""
        return asyncio.get_running_loop().call_later(
            self.warn_after, _warn_long, job, self.warn_after
        )

    # -- the completion ------------------------------------------------------------------------------

    def _statement(self, job: ClaimedJob, result: str | None) -> tuple[Any, dict[str, Any]]:
        # The completion and its parameters: with the result, for a kind that stores one.
        if result is None:
            return self._complete, {"ids": [job.id], "token": job.lease_token}
        return self._complete_results, {
            "ids": [job.id],
            "token": job.lease_token,
            "results": [result],
        }

    def _keeping(
        self, job: ClaimedJob, exc: IntegrityError, stored: str | None
    ) -> tuple[Any, dict[str, Any]]:
        # The job kept ``completed`` instead; with its result, for a kind that stores one.
        if stored is None:
            return self._keep, _keep_params(job, exc)
        return self._keep_result, {**_keep_params(job, exc), "result": stored}

    def _complete_sync(self, session: Session, job: ClaimedJob, stored: str | None) -> None:
        complete, params = self._statement(job, stored)
        if self.deferred:
            session.execute(_IMMEDIATE)
        if not self.savepoint:
            try:
                row = session.execute(complete, params, execution_options=self._options).first()
            except IntegrityError as exc:
                self.savepoint = True
                raise CompletionRefused(_refused(exc)) from None
        else:
            try:
                with session.begin_nested():
                    row = session.execute(complete, params, execution_options=self._options).first()
            except IntegrityError as exc:
                keep, params = self._keeping(job, exc, stored)
                row = session.execute(keep, params, execution_options=self._options).first()
                _log_kept(job, exc, row)
        if row is None:
            raise LeaseLostError(_lost(job))

    async def _complete_async(
        self, session: AsyncSession, job: ClaimedJob, stored: str | None
    ) -> None:
        complete, params = self._statement(job, stored)
        if self.deferred:
            await session.execute(_IMMEDIATE)
        if not self.savepoint:
            try:
                result = await session.execute(complete, params, execution_options=self._options)
            except IntegrityError as exc:
                self.savepoint = True
                raise CompletionRefused(_refused(exc)) from None
            row = result.first()
        else:
            try:
                async with session.begin_nested():
                    result = await session.execute(
                        complete, params, execution_options=self._options
                    )
                    row = result.first()
            except IntegrityError as exc:
                keep, params = self._keeping(job, exc, stored)
                result = await session.execute(keep, params, execution_options=self._options)
                row = result.first()
                _log_kept(job, exc, row)
        if row is None:
            raise LeaseLostError(_lost(job))


def _result(kind: Kind, job: ClaimedJob, value: object) -> str | None:
    # Encoded inside the transaction: a result that cannot be stored rolls the handler's
    # writes back with the run (ResultError).
    return encode_result(job.id, job.kind, value) if kind.options.results else None


def _check_deadline(ctx: JobContext) -> None:
    # A sync handler cannot be interrupted; past its timeout its run has already failed (or is
    # about to), so its transaction must not commit the job as completed.
    if ctx.deadline is not None and time.monotonic() > ctx.deadline:
        raise HandlerTimeout("returned after its timeout: its transaction was rolled back")


def _keep_params(job: ClaimedJob, exc: IntegrityError) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "token": job.lease_token,
        "error": f"completed; not deleted: {_first(exc)}",
    }


def _first(exc: IntegrityError) -> str:
    return str(exc.orig or exc).strip().splitlines()[0]


def _refused(exc: IntegrityError) -> str:
    return (
        f"the handler succeeded but its job's row could not be deleted ({_first(exc)}): a "
        "foreign key points at it; its transaction was rolled back and its retry keeps the row "
        "'completed' instead"
    )


def _lost(job: ClaimedJob) -> str:
    return f"job {job.id}: lease lost before its completion; the handler's transaction rolled back"


def _log_kept(job: ClaimedJob, exc: IntegrityError, row: Any) -> None:
    if row is not None:
        log.error(
            "job %s (%s) succeeded, but its row could not be deleted (%s); kept in state "
            "'completed', it will not run again",
            job.id,
            job.kind,
            _first(exc),
            extra={"event": "kept_completed", "job_id": job.id, "kind": job.kind},
        )


def _warn_long(job: ClaimedJob, seconds: float) -> None:
    log.warning(
        "job %s (%s) has held its Session's transaction open for %gs: a long transaction holds "
        "back vacuum on every table; keep handlers that take a Session short",
        job.id,
        job.kind,
        seconds,
        extra={"event": "long_transaction", "job_id": job.id, "kind": job.kind},
    )
