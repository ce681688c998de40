"""The one enqueue dispatch, for :class:`~sqla_jobs.Jobs`' sync calls and their ``_async`` twins.

A call is planned first (:class:`EnqueuePlans`: the options, the payloads and the links checked,
the hooks run; no I/O), then run by :func:`enqueue` or :func:`enqueue_many`, which take a unique
job to ``ON CONFLICT`` (:mod:`~sqla_jobs.enqueue.unique`), a plain one to INSERT or COPY
(:mod:`~sqla_jobs.enqueue.insert`), and insert the links. A sync call runs them on its
``Session``; an async one in its ``AsyncSession``'s greenlet (``run_sync``), so both take the same
path and hold the same guarantees.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqla_jobs import links as _links
from sqla_jobs.db.preflight import missing_queue_table
from sqla_jobs.enqueue import depends as _depends
from sqla_jobs.enqueue import insert as _insert
from sqla_jobs.enqueue import unique as _unique
from sqla_jobs.enqueue import validate as _validate
from sqla_jobs.enqueue import validate_many as _validate_many
from sqla_jobs.enqueue.meta import MetaArg
from sqla_jobs.enqueue.row import Batch, Prepared
from sqla_jobs.enqueue.wakeup import Wakeup
from sqla_jobs.kinds import Registry
from sqla_jobs.model import Job
from sqla_jobs.unique import EnqueuedIds, OnConflict, check_on_conflict

if TYPE_CHECKING:
    from sqla_jobs.hooks import Hooks

#: What a statement of the enqueue raises from the server: SQLAlchemy's wrapper, or the driver's
#: own error from the COPY path, which runs on the driver's connection.
DB_ERRORS: tuple[type[BaseException], ...] = (DBAPIError, psycopg.Error)

#: What :func:`enqueue` takes after the session, as :meth:`EnqueuePlans._plan_one` returns it.
OnePlan = tuple[
    Prepared,
    datetime | None,
    timedelta,
    _links.Checked,
    OnConflict,
    str | None,
    Wakeup,
    _depends.Depends | None,
]
#: What :func:`enqueue_many` takes after the session, as :meth:`EnqueuePlans._plan_many` returns it.
ManyPlan = tuple[
    int,
    Iterator[Batch],
    bool,
    datetime | None,
    timedelta,
    list[_links.Checked] | None,
    OnConflict,
    str | None,
    Wakeup,
    _depends.Depends | None,
]


def enqueue(
    session: Session,
    job: Prepared,
    run_at: datetime | None,
    delay: timedelta,
    links: _links.Checked,
    on_conflict: OnConflict,
    schema: str | None,
    wakeup: Wakeup,
    deps: _depends.Depends | None = None,
) -> Job:
    """Insert one planned job (unique or plain) and its links through ``session``, and its
    dependencies (not for a unique job's existing holder, whose dependencies never change); a
    database never migrated raises :class:`~sqla_jobs.errors.NotMigratedError`."""
    try:
        if deps is not None:
            start = _depends.resolve(session, deps, schema)
        if job.unique is not None:
            found = _unique.enqueue(
                session, job, run_at, delay, schema=schema, wakeup=wakeup, on_conflict=on_conflict
            )
        else:
            found = _insert.enqueue(session, job, run_at, delay, schema=schema, wakeup=wakeup)
        if links:
            _links.insert(session, [links], [found.id], schema, fresh=found.inserted is not False)
        if deps is not None and found.inserted is not False:
            _depends.attach(session, [found.id], deps, schema)
            _depends.mark(session, found, start)
    except DB_ERRORS as exc:
        missing = missing_queue_table(exc, schema)
        if missing is None:
            raise
        raise missing from exc
    return found


def enqueue_many(
    session: Session,
    count: int,
    chunks: Iterator[Batch],
    any_unique: bool,
    run_at: datetime | None,
    delay: timedelta,
    links: list[_links.Checked] | None,
    on_conflict: OnConflict,
    schema: str | None,
    wakeup: Wakeup,
    deps: _depends.Depends | None = None,
) -> EnqueuedIds:
    """Insert ``count`` planned jobs, validated a chunk at a time by ``chunks``, and their
    links through ``session``; the unique path when ``any_unique``, else INSERT or COPY. A
    database never migrated raises :class:`~sqla_jobs.errors.NotMigratedError`."""
    try:
        if deps is not None:
            _depends.resolve(session, deps, schema)  # an unknown parent raises, nothing written
        if any_unique:
            ids = _unique.enqueue_many(
                session,
                chunks,
                run_at,
                delay,
                schema=schema,
                wakeup=wakeup,
                on_conflict=on_conflict,
            )
        else:
            ids = EnqueuedIds(
                _insert.enqueue_many(
                    session, count, chunks, run_at, delay, schema=schema, wakeup=wakeup
                )
            )
        if links:
            _links.insert(session, links, ids, schema, fresh=not ids.duplicates)
        if deps is not None:
            fresh = [i for i, new in zip(ids, ids.inserted, strict=True) if new]
            _depends.attach(session, fresh, deps, schema)
    except DB_ERRORS as exc:
        missing = missing_queue_table(exc, schema)
        if missing is None:
            raise
        raise missing from exc
    return ids


class EnqueuePlans(Registry):
    """Plans the enqueue calls of :class:`~sqla_jobs.Jobs`: everything before the first SQL
    statement, so that bad input raises with nothing written and the transaction usable."""

    schema: str | None
    max_payload_bytes: int
    hooks: Hooks
    _wakeup: Wakeup

    def _plan_one(
        self,
        payload: BaseModel | str,
        data: dict[str, Any] | None,
        delay: timedelta | float | None,
        run_at: datetime | None,
        priority: int | None,
        queue: str | None,
        max_attempts: int | None,
        concurrency_key: str | None,
        meta: Mapping[str, Any] | None,
        unique_key: str | None,
        on_conflict: OnConflict,
        link: _links.LinkArg,
        depends_on: _depends.DependsArg = None,
        on_parent_failure: _depends.OnParentFailure = "cancel",
    ) -> OnePlan:
        check_on_conflict(on_conflict)
        links = _links.check(link)
        deps = _depends.check(depends_on, on_parent_failure)
        prepared = _validate.prepare(
            self,
            payload,
            data,
            max_bytes=self.max_payload_bytes,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            concurrency_key=concurrency_key,
            meta=meta,
            unique_key=unique_key,
        )
        # The hooks' one call site on the single path: nothing to do without a hook.
        if self.hooks.enqueue_hooks:
            prepared = self.hooks._enqueue_one(prepared)
        when, after = _validate.schedule(delay, run_at)
        return prepared, when, after, links, on_conflict, self.schema, self._wakeup, deps

    def _plan_many(
        self,
        payloads: Iterable[BaseModel],
        delay: timedelta | float | None,
        run_at: datetime | None,
        priority: int | None,
        queue: str | None,
        max_attempts: int | None,
        meta: MetaArg,
        on_conflict: OnConflict,
        link: _links.LinksArg,
        depends_on: _depends.DependsArg = None,
        on_parent_failure: _depends.OnParentFailure = "cancel",
    ) -> ManyPlan:
        check_on_conflict(on_conflict)
        deps = _depends.check(depends_on, on_parent_failure)
        when, after = _validate.schedule(delay, run_at)
        items = payloads if isinstance(payloads, list) else list(payloads)
        links = _links.check_many(link, len(items))
        chunks = _validate_many.prepare_chunks(
            self,
            items,
            size=_insert.CHUNK,
            max_bytes=self.max_payload_bytes,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            meta=meta,
        )
        # The hooks' one call site on the bulk paths (INSERT and COPY): once per chunk, as the
        # chunk is validated; nothing to do without a hook.
        if self.hooks.enqueue_hooks:
            chunks = self.hooks._enqueue_chunks(chunks)
        any_unique = self._any_unique(items)
        return (
            len(items),
            chunks,
            any_unique,
            when,
            after,
            links,
            on_conflict,
            self.schema,
            self._wakeup,
            deps,
        )

    def _any_unique(self, payloads: list[BaseModel]) -> bool:
        """Whether some of ``payloads`` are of a unique kind (nothing to look at when no kind
        is: the plain path pays nothing)."""
        if not any(k.options.unique for k in self):
            return False
        models = {type(p) for p in payloads}
        return any(k.options.unique is not None for k in self if k.model in models)
