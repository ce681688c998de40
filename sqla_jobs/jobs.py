"""``Jobs``: the facade an application holds: its kinds, and enqueue into the caller's session."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from pydantic import BaseModel
from sqlalchemy.orm import Session

from . import enqueue as _enqueue
from . import validate as _validate
from ._jobs_ops import Operations
from .errors import ConfigurationError
from .hooks import Hooks
from .kinds import H, Handler, Kind, Registry, check_name
from .model import Job, cancel_channel, notify_channel

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024


class Jobs(Operations, Registry):
    """The job kinds of an application, and the enqueue calls that ride the caller's transaction.

    ``schema`` names the schema that holds the queue table (default: the connection's
    ``search_path``); it must match the schema the migrations ran in. ``max_payload_bytes`` bounds the
    serialized payload (keep big data in your own tables and enqueue its id). ``hooks`` holds the
    enqueue and worker hooks (:class:`~sqla_jobs.hooks.Hooks`).
    """

    def __init__(
        self, *, schema: str | None = None, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    ) -> None:
        super().__init__()
        if schema is not None:
            try:
                check_name("schema", schema)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        if max_payload_bytes < 2:
            raise ConfigurationError("max_payload_bytes must be at least 2 (the JSON '{}')")
        self.schema = schema
        self.max_payload_bytes = max_payload_bytes
        #: The LISTEN/NOTIFY channel workers of this schema listen on.
        self.channel = notify_channel(schema)
        #: The channel that tells them which running jobs were cancelled.
        self.cancel_channel = cancel_channel(schema)
        #: Enqueue hooks, middleware and outcome hooks (:class:`~sqla_jobs.hooks.Hooks`).
        self.hooks = Hooks()

    # -- registration (see Registry.register / Registry.kind) ---------------------------------

    def register(
        self, name: str, model: type[BaseModel], handler: Handler | None = None, **options: Any
    ) -> Kind:
        """Register ``model`` as the payload of kind ``name``, with its handler and options.

        Options: ``queue``, ``priority`` (lower runs first), ``max_attempts`` (handler failures before
        dead), ``max_crashes`` (expired leases before dead), ``backoff`` (:class:`Backoff`),
        ``timeout`` (seconds), ``concurrency_key`` (a function of the payload returning a str) and
        ``concurrency_limit`` (jobs per key running at once, default 1 with a key function). The
        kind string is what is stored: renaming the class is safe.
        A process that only enqueues may register without a handler.
        """
        return super().register(name, model, handler, **options)

    def kind(self, name: str, model: type[BaseModel], **options: Any) -> Callable[[H], H]:
        """Decorator: register the decorated function as the handler of kind ``name``."""
        return super().kind(name, model, **options)

    # -- enqueue --------------------------------------------------------------------------------

    @overload
    def enqueue(
        self,
        session: Session,
        payload: BaseModel,
        *,
        delay: timedelta | float | None = ...,
        run_at: datetime | None = ...,
        priority: int | None = ...,
        queue: str | None = ...,
        max_attempts: int | None = ...,
        concurrency_key: str | None = ...,
        meta: Mapping[str, Any] | None = ...,
    ) -> Job: ...

    @overload
    def enqueue(
        self,
        session: Session,
        payload: str,
        data: dict[str, Any],
        *,
        delay: timedelta | float | None = ...,
        run_at: datetime | None = ...,
        priority: int | None = ...,
        queue: str | None = ...,
        max_attempts: int | None = ...,
        concurrency_key: str | None = ...,
        meta: Mapping[str, Any] | None = ...,
    ) -> Job: ...

    def enqueue(
        self,
        session: Session,
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
    ) -> Job:
        """Add a job to ``session``'s transaction and return it, flushed (its ``id`` is set).

        ``payload`` is an instance of a registered model, or a kind name followed by a mapping.
        Guarantees: opens no connection and never commits; the job exists if and only if the
        caller's transaction commits (a rollback, of the transaction or of a savepoint around the
        call, discards it). Workers are woken by a NOTIFY that Postgres delivers only at commit, sent
        at most once per queue per transaction and never carrying the payload. ``delay`` is added
        to the database clock; ``run_at`` must be timezone-aware. ``concurrency_key`` overrides the
        kind's key function (the kind must declare a ``concurrency_limit``). ``meta`` is the job's
        tags and context, stored in its ``meta`` column (jsonb) and never read by a claim: a
        mapping of str keys to JSON values, at most 8 KiB serialized (an
        :class:`~sqla_jobs.InvalidMetaError` otherwise); the ``on_enqueue`` hooks may add to it.
        On bad input an :class:`EnqueueError` subclass is raised before any SQL runs: nothing is
        written and the transaction stays usable.
        """
        prepared = self._prepare(
            payload, data, priority, queue, max_attempts, concurrency_key, meta
        )
        when, after = _validate.schedule(delay, run_at)
        return _enqueue.enqueue(
            session, prepared, when, after, schema=self.schema, channel=self.channel
        )

    def enqueue_many(
        self,
        session: Session,
        payloads: Iterable[BaseModel],
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        meta: _validate.MetaArg = None,
    ) -> list[int]:
        """Add many jobs to ``session``'s transaction; return their ids in order.

        Same guarantees as :meth:`enqueue`: one bad payload raises, naming its position, and writes
        none of them. Payloads may be of different kinds. From 64 payloads on, the rows go by COPY,
        and past the first 1,024 they are validated while the server stores the ones before them,
        inside a savepoint that a bad one rolls back (see :func:`sqla_jobs.enqueue.enqueue_many`).
        ``meta`` is one mapping for every job (checked and serialized once), or a sequence of one
        mapping (or None) per payload; each is checked as :meth:`enqueue`'s ``meta`` is, all before
        any SQL runs.
        """
        when, after = _validate.schedule(delay, run_at)
        items = payloads if isinstance(payloads, list) else list(payloads)
        chunks = self._prepare_chunks(items, priority, queue, max_attempts, meta)
        return _enqueue.enqueue_many(
            session, len(items), chunks, when, after, schema=self.schema, channel=self.channel
        )

    async def enqueue_async(
        self,
        session: AsyncSession,
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
    ) -> Job:
        """:meth:`enqueue` for an ``AsyncSession``, with the same guarantees."""
        prepared = self._prepare(
            payload, data, priority, queue, max_attempts, concurrency_key, meta
        )
        when, after = _validate.schedule(delay, run_at)
        return await _enqueue.enqueue_async(
            session, prepared, when, after, schema=self.schema, channel=self.channel
        )

    async def enqueue_many_async(
        self,
        session: AsyncSession,
        payloads: Iterable[BaseModel],
        *,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        meta: _validate.MetaArg = None,
    ) -> list[int]:
        """:meth:`enqueue_many` for an ``AsyncSession``, with the same guarantees."""
        when, after = _validate.schedule(delay, run_at)
        items = payloads if isinstance(payloads, list) else list(payloads)
        chunks = self._prepare_chunks(items, priority, queue, max_attempts, meta)
        return await _enqueue.enqueue_many_async(
            session, len(items), chunks, when, after, schema=self.schema, channel=self.channel
        )

    def _prepare(
        self,
        payload: BaseModel | str,
        data: dict[str, Any] | None,
        priority: int | None,
        queue: str | None,
        max_attempts: int | None,
        concurrency_key: str | None,
        meta: Mapping[str, Any] | None,
    ) -> _validate.Prepared:
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
        )
        # The hooks' one call site on the single path: nothing to do without a hook.
        if self.hooks.enqueue_hooks:
            prepared = self.hooks._enqueue_one(prepared)
        return prepared

    def _prepare_chunks(
        self,
        payloads: list[BaseModel],
        priority: int | None,
        queue: str | None,
        max_attempts: int | None,
        meta: _validate.MetaArg,
    ) -> Iterator[_validate.Batch]:
        chunks = _validate.prepare_chunks(
            self,
            payloads,
            size=_enqueue.CHUNK,
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
        return chunks
