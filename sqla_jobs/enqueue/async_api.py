"""The ``_async`` twins of :meth:`Jobs.enqueue <sqla_jobs.Jobs.enqueue>` and
:meth:`Jobs.enqueue_many <sqla_jobs.Jobs.enqueue_many>`, for an ``AsyncSession``: the same
preparation (validation, hooks) as the sync calls, then the async statements."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sqla_jobs import links as _links
from sqla_jobs.db import sessions as _sessions
from sqla_jobs.enqueue import insert as _enqueue
from sqla_jobs.enqueue import unique as _unique_enqueue
from sqla_jobs.enqueue import validate as _validate
from sqla_jobs.enqueue.wakeup import Wakeup
from sqla_jobs.model import Job
from sqla_jobs.unique import EnqueuedIds, OnConflict, check_on_conflict

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session


class AsyncEnqueue:
    """The async enqueue calls of :class:`~sqla_jobs.Jobs`."""

    schema: str | None
    channel: str
    _wakeup: Wakeup

    if TYPE_CHECKING:  # defined by Jobs

        def _prepare(
            self,
            payload: BaseModel | str,
            data: dict[str, Any] | None,
            priority: int | None,
            queue: str | None,
            max_attempts: int | None,
            concurrency_key: str | None,
            meta: Mapping[str, Any] | None,
            unique_key: str | None = None,
        ) -> _validate.Prepared: ...

        def _any_unique(self, payloads: list[BaseModel]) -> bool: ...

        def _prepare_chunks(
            self,
            payloads: list[BaseModel],
            priority: int | None,
            queue: str | None,
            max_attempts: int | None,
            meta: _validate.MetaArg,
        ) -> Iterator[_validate.Batch]: ...

    async def enqueue_async(
        self,
        session: AsyncSession | async_scoped_session[Any],
        payload: BaseModel | str,
        data: dict[str, Any] | None = None,
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        concurrency_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        unique_key: str | None = None,
        on_conflict: OnConflict = "skip",
        link: _links.LinkArg = None,
    ) -> Job:
        """:meth:`enqueue` for an ``AsyncSession``, with the same guarantees."""
        check_on_conflict(on_conflict)
        links = _links.check(link)
        prepared = self._prepare(
            payload, data, priority, queue, max_attempts, concurrency_key, meta, unique_key
        )
        when, after = _validate.schedule(delay, run_at)
        session = _sessions.current_async(session)
        if prepared.unique is not None:
            job = await _unique_enqueue.enqueue_async(
                session,
                prepared,
                when,
                after,
                schema=self.schema,
                wakeup=self._wakeup,
                on_conflict=on_conflict,
            )
        else:
            job = await _enqueue.enqueue_async(
                session, prepared, when, after, schema=self.schema, wakeup=self._wakeup
            )
        if links:
            fresh = job.inserted is not False
            await session.run_sync(_links.insert, [links], [job.id], self.schema, fresh=fresh)
        return job

    async def enqueue_many_async(
        self,
        session: AsyncSession | async_scoped_session[Any],
        payloads: Iterable[BaseModel],
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        meta: _validate.MetaArg = None,
        on_conflict: OnConflict = "skip",
        link: _links.LinksArg = None,
    ) -> EnqueuedIds:
        """:meth:`enqueue_many` for an ``AsyncSession``, with the same guarantees."""
        check_on_conflict(on_conflict)
        when, after = _validate.schedule(delay, run_at)
        items = payloads if isinstance(payloads, list) else list(payloads)
        links = _links.check_many(link, len(items))
        chunks = self._prepare_chunks(items, priority, queue, max_attempts, meta)
        session = _sessions.current_async(session)
        if self._any_unique(items):
            ids = await _unique_enqueue.enqueue_many_async(
                session,
                chunks,
                when,
                after,
                schema=self.schema,
                wakeup=self._wakeup,
                on_conflict=on_conflict,
            )
        else:
            ids = EnqueuedIds(
                await _enqueue.enqueue_many_async(
                    session,
                    len(items),
                    chunks,
                    when,
                    after,
                    schema=self.schema,
                    wakeup=self._wakeup,
                )
            )
        if links:
            fresh = not ids.duplicates
            await session.run_sync(_links.insert, links, ids, self.schema, fresh=fresh)
        return ids
