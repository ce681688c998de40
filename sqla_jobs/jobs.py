"""``Jobs``: the facade an application holds: its kinds, and enqueue into the caller's session."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, overload

from pydantic import BaseModel
from sqlalchemy.orm import Session, scoped_session

from sqla_jobs import links as _links
from sqla_jobs.db import sessions as _sessions
from sqla_jobs.enqueue import dispatch as _dispatch
from sqla_jobs.enqueue.async_api import AsyncEnqueue
from sqla_jobs.enqueue.depends import DependsArg, OnParentFailure
from sqla_jobs.enqueue.meta import MetaArg
from sqla_jobs.enqueue.wakeup import Wakeup, WakeupMode, check_mode
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.hooks import Hooks
from sqla_jobs.kinds import Registry, check_name
from sqla_jobs.model import Job, cancel_channel, notify_channel
from sqla_jobs.operations.facade import Operations
from sqla_jobs.periodic.declare import Periodics
from sqla_jobs.unique import EnqueuedIds, OnConflict

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
#: PostgreSQL's longest name (NAMEDATALEN - 1): pg_notify refuses a longer channel.
MAX_CHANNEL_BYTES = 63


class Jobs(AsyncEnqueue, Operations, Periodics, Registry):
    """The job kinds of an application, and the enqueue calls that ride the caller's transaction.

    ``schema`` names the schema that holds the queue table (default: the connection's
    ``search_path``); it must match the schema the migrations ran in, and be at most 46
    characters (its channels, ``sqla_jobs.<schema>.cancel``, are PostgreSQL names).
    ``max_payload_bytes`` bounds the serialized payload (keep big data in your own tables and
    enqueue its id). ``hooks`` holds the enqueue and worker hooks (:class:`~sqla_jobs.hooks.Hooks`).

    ``wakeup`` says how an enqueue of a job due now wakes idle workers (a delayed job wakes no
    one: the poll after its time finds it): ``"after_commit"`` (default) sends the NOTIFY after
    the Session's commit, from a per-process notifier on a connection of its own, so that
    enqueuing commits never queue on PostgreSQL's notification lock; ``"in_transaction"`` sends it
    inside the enqueuing transaction, at most once per queue every 0.1 s per process;
    ``"none"`` leaves it to the workers' polling. A Session bound to a ``Connection`` gets the
    in-transaction NOTIFY in ``"after_commit"`` mode too (it cannot see the real commit).

    Every call that takes a ``session`` takes a ``Session`` or a ``scoped_session`` (such as
    Flask-SQLAlchemy's ``db.session``), and every ``_async`` twin an ``AsyncSession`` or an
    ``async_scoped_session``: a scoped session stands for its current session, whose transaction
    the call rides as it would ride that session's given directly.
    """

    def __init__(
        self,
        *,
        schema: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        wakeup: WakeupMode = "after_commit",
    ) -> None:
        super().__init__()
        if schema is not None:
            try:
                check_name("schema", schema)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
            if len(cancel_channel(schema)) > MAX_CHANNEL_BYTES:
                raise ConfigurationError(
                    f"schema name {schema!r} is too long: at most "
                    f"{MAX_CHANNEL_BYTES - len(cancel_channel(''))} characters, so that its "
                    f"LISTEN/NOTIFY channels ({cancel_channel(schema)!r}) fit PostgreSQL's "
                    f"{MAX_CHANNEL_BYTES}-byte names"
                )
        if max_payload_bytes < 2:
            raise ConfigurationError("max_payload_bytes must be at least 2 (the JSON '{}')")
        self.schema = schema
        self.max_payload_bytes = max_payload_bytes
        try:
            mode = check_mode(wakeup)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        #: The LISTEN/NOTIFY channel workers of this schema listen on.
        self.channel = notify_channel(schema)
        #: The channel that tells them which running jobs were cancelled.
        self.cancel_channel = cancel_channel(schema)
        self._wakeup = Wakeup(self.channel, mode)
        #: Enqueue hooks, middleware and outcome hooks (:class:`~sqla_jobs.hooks.Hooks`).
        self.hooks = Hooks()

    # -- registration: Registry.register and Registry.kind, whose signatures mypy checks a
    # handler and its options against (generic in the payload model; see sqla_jobs.kinds).

    # -- enqueue --------------------------------------------------------------------------------

    @overload
    def enqueue(
        self,
        session: Session | scoped_session[Any],
        payload: BaseModel,
        *,
        delay: timedelta | float | None = ...,
        run_at: datetime | None = ...,
        priority: int | None = ...,
        queue: str | None = ...,
        max_attempts: int | None = ...,
        concurrency_key: str | None = ...,
        meta: Mapping[str, Any] | None = ...,
        unique_key: str | None = ...,
        on_conflict: OnConflict = ...,
        link: _links.LinkArg = ...,
        depends_on: DependsArg = ...,
        on_parent_failure: OnParentFailure = ...,
    ) -> Job: ...

    @overload
    def enqueue(
        self,
        session: Session | scoped_session[Any],
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
        unique_key: str | None = ...,
        on_conflict: OnConflict = ...,
        link: _links.LinkArg = ...,
        depends_on: DependsArg = ...,
        on_parent_failure: OnParentFailure = ...,
    ) -> Job: ...

    def enqueue(
        self,
        session: Session | scoped_session[Any],
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
        """Add a job to ``session``'s transaction and return it, flushed (its ``id`` is set).

        ``payload`` is an instance of a registered model, or a kind name followed by a mapping.
        Guarantees: opens no connection and never commits; the job exists if and only if the
        caller's transaction commits (a rollback, of the transaction or of a savepoint around the
        call, discards it). Workers are woken by a NOTIFY that Postgres delivers only at commit, sent
        at most once per queue per transaction and never carrying the payload. ``delay`` is added
        to the database clock; ``run_at`` must be timezone-aware. ``concurrency_key`` overrides the
        kind's key function (the kind must declare a ``concurrency_limit``). ``meta`` is the job's
        tags and context, stored in its ``meta`` column (jsonb), read by a worker only for a
        middleware that asks (``ctx.meta``): a mapping of str keys to JSON values, at most 8 KiB
        serialized (an :class:`~sqla_jobs.InvalidMetaError` otherwise); the ``on_enqueue`` hooks
        may add to it.
        On bad input an :class:`EnqueueError` subclass is raised before any SQL runs: nothing is
        written and the transaction stays usable.

        A unique job (its kind declares :class:`~sqla_jobs.Unique`, or ``unique_key`` is given:
        a key of this kind's jobs) is inserted only if no job holds its key in a state that
        counts; otherwise, by ``on_conflict``: ``"skip"`` returns the job holding the key
        (``job.inserted`` is False), ``"replace"`` updates that job's payload, run_at, priority
        and meta if it is pending (``job.replaced``) and returns it as ``"skip"`` does if not,
        ``"raise"`` raises :class:`~sqla_jobs.DuplicateJobError`. None of them aborts the
        transaction. A second enqueuer of a key waits for the first one's transaction to end.

        ``link`` links the job to rows of the application's link tables (``{order_jobs:
        order.id}``, see :func:`sqla_jobs.link_table`) in the same transaction: the job returned
        is linked (for a duplicate, the job holding the key). Checked before any SQL: each key a
        link table, each value a flushed row's id of its column's type (else
        :class:`~sqla_jobs.InvalidOptionError`). A row that does not exist is a foreign key
        violation, as for any insert of yours.

        ``depends_on`` (jobs or job ids) makes the job wait until every one of them completed: it
        is ``waiting`` (never claimed) while some are unfinished, and the transaction that
        completes the last one makes it ``pending`` and wakes its queue (its own delay still
        holds). A parent that ends dead, cancelled or deleted cancels it, and its own dependents
        after it, with the parent's id and outcome in ``errors``, unless ``on_parent_failure=
        "run"`` (that parent then counts as done). A parent already finished counts at once: a
        completed one as done, a dead or cancelled one by the failure rule. A parent that is
        neither a job nor a recorded outcome raises :class:`~sqla_jobs.DependencyError` before
        anything is written (the transaction stays usable). Retrying a dead parent later does
        not bring back the children it cancelled. A unique job's existing holder keeps its own
        dependencies. Exact whichever of the child's enqueue and a parent's end commits first:
        the enqueue's commit locks the parents (in id order) and recounts them.
        """
        plan = self._plan_one(
            payload, data, delay, run_at, priority, queue, max_attempts, concurrency_key, meta,
            unique_key, on_conflict, link, depends_on, on_parent_failure,
        )  # fmt: skip
        return _dispatch.enqueue(_sessions.current(session), *plan)

    def enqueue_many(
        self,
        session: Session | scoped_session[Any],
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
        """Add many jobs to ``session``'s transaction; return their ids in order.

        Same guarantees as :meth:`enqueue`: one bad payload raises, naming its position, and writes
        none of them. Payloads may be of different kinds. From 64 payloads on, the rows go by COPY,
        and past the first 1,024 they are validated while the server stores the ones before them,
        inside a savepoint that a bad one rolls back.
        ``meta`` is one mapping for every job (checked and serialized once), or a sequence of one
        mapping (or None) per payload; each is checked as :meth:`enqueue`'s ``meta`` is, all before
        any SQL runs.

        Unique jobs (of kinds declaring :class:`~sqla_jobs.Unique`) are inserted as
        :meth:`enqueue` inserts them, by ``on_conflict``, in one ``INSERT ... ON CONFLICT`` in
        the order of their keys (so two batches sharing keys cannot deadlock), after every payload
        was validated; a key repeated within the batch counts once (the first payload wins; with
        ``"replace"``, the last). The result is a list of ids with ``inserted`` (and
        ``replaced``) flags per payload; a duplicate's id is the job holding its key. With
        ``"raise"``, a duplicate raises :class:`~sqla_jobs.DuplicateJobError` and nothing is
        written.

        ``link``, as :meth:`enqueue`'s, is one mapping for every job or a sequence of one mapping
        (or None) per payload, all checked before any SQL runs; the links go in one statement per
        link table once the jobs are in.

        ``depends_on`` and ``on_parent_failure``, as :meth:`enqueue`'s, apply to every job
        inserted (not to a duplicate's holder).
        """
        plan = self._plan_many(
            payloads, delay, run_at, priority, queue, max_attempts, meta, on_conflict, link,
            depends_on, on_parent_failure,
        )  # fmt: skip
        return _dispatch.enqueue_many(_sessions.current(session), *plan)

    # -- workflows: the common shapes of depends_on ------------------------------------------------

    def chain(
        self,
        session: Session | scoped_session[Any],
        payloads: Iterable[BaseModel],
        *,
        depends_on: DependsArg = None,
        on_parent_failure: OnParentFailure = "cancel",
    ) -> list[Job]:
        """Enqueue ``payloads`` so that each runs after the one before it completed; returns the
        jobs in order. The first depends on ``depends_on`` (if given). Same transaction and
        guarantees as :meth:`enqueue` (one call per job, each with the kind's own options); a
        step that fails dead cancels the rest of the chain unless ``on_parent_failure="run"``."""
        made: list[Job] = []
        parents = depends_on
        for payload in payloads:
            job = self.enqueue(
                session, payload, depends_on=parents, on_parent_failure=on_parent_failure
            )
            made.append(job)
            parents = [job.id]
        return made

    def group(
        self,
        session: Session | scoped_session[Any],
        payloads: Iterable[BaseModel],
        *,
        then: BaseModel,
        on_parent_failure: OnParentFailure = "cancel",
    ) -> tuple[EnqueuedIds, Job]:
        """Enqueue ``payloads`` (run in any order, in parallel) and ``then``, which runs once
        after every one of them completed; returns their ids and ``then``'s job. One
        :meth:`enqueue_many` and one :meth:`enqueue` in ``session``'s transaction. A member that
        ends dead or cancelled cancels ``then`` unless ``on_parent_failure="run"``."""
        ids = self.enqueue_many(session, payloads)
        final = self.enqueue(
            session, then, depends_on=list(ids), on_parent_failure=on_parent_failure
        )
        return ids, final
