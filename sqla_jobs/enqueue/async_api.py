"""The ``_async`` twins of :meth:`Jobs.enqueue <sqla_jobs.Jobs.enqueue>` and
:meth:`Jobs.enqueue_many <sqla_jobs.Jobs.enqueue_many>`, for an ``AsyncSession``: the same plan
and the same dispatch as the sync calls (:mod:`~sqla_jobs.enqueue.dispatch`), run through
``AsyncSession.run_sync``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sqla_jobs import links as _links
from sqla_jobs.db import sessions as _sessions
from sqla_jobs.enqueue import dispatch as _dispatch
from sqla_jobs.enqueue.depends import DependsArg, OnParentFailure
from sqla_jobs.enqueue.dispatch import EnqueuePlans
from sqla_jobs.enqueue.meta import MetaArg
from sqla_jobs.model import Job
from sqla_jobs.unique import EnqueuedIds, OnConflict

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session


class AsyncEnqueue(EnqueuePlans):
    """The async enqueue calls of :class:`~sqla_jobs.Jobs`: planned as the sync ones are, then
    run by the same dispatch in the ``AsyncSession``'s greenlet."""

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
        depends_on: DependsArg = None,
        on_parent_failure: OnParentFailure = "cancel",
    ) -> Job:
        """:meth:`enqueue` for an ``AsyncSession``, with the same guarantees."""
        plan = self._plan_one(
            payload, data, delay, run_at, priority, queue, max_attempts, concurrency_key, meta,
            unique_key, on_conflict, link, depends_on, on_parent_failure,
        )  # fmt: skip
        return await _sessions.current_async(session).run_sync(_dispatch.enqueue, *plan)

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
        meta: MetaArg = None,
        on_conflict: OnConflict = "skip",
        link: _links.LinksArg = None,
        depends_on: DependsArg = None,
        on_parent_failure: OnParentFailure = "cancel",
    ) -> EnqueuedIds:
        """:meth:`enqueue_many` for an ``AsyncSession``, with the same guarantees."""
        plan = self._plan_many(
            payloads, delay, run_at, priority, queue, max_attempts, meta, on_conflict, link,
            depends_on, on_parent_failure,
        )  # fmt: skip
        return await _sessions.current_async(session).run_sync(_dispatch.enqueue_many, *plan)
