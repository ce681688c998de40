"""Helpers for your own tests: see what a code path enqueued, and run jobs inline.

They work inside the test's transaction (including one rolled back at the end, such as the
``sqla_jobs_session`` fixture's of the pytest plugin, :mod:`sqla_jobs.pytest_plugin`), because
they use the test's own ``Session``; every helper has an ``_async`` twin for an ``AsyncSession``:

.. code-block:: python

    def test_checkout_sends_the_invoice(sqla_jobs_session):
        checkout(sqla_jobs_session, cart)
        testing.assert_enqueued(sqla_jobs_session, "send_invoice", invoice_id=cart.invoice_id)
        assert testing.run_jobs(jobs, sqla_jobs_session).done == 1

By default they see only the jobs the test's transaction wrote (inserted, or last changed, in it
or in one of its savepoints), never a job another test left behind; ``all_jobs=True`` sees every
job the session can see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.util import await_only

from sqla_jobs.db.sessions import current, current_async
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.jobs import Jobs
from sqla_jobs.kinds import load_payload
from sqla_jobs.model import Job
from sqla_jobs.sql import testing as testing_sql
from sqla_jobs.testing.runs import JobFailed, RunResult, Scope, Shell, run
from sqla_jobs.worker.config import WorkerSeams

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session

__all__ = [
    "JobFailed",
    "RunResult",
    "WorkerSeams",
    "assert_enqueued",
    "assert_enqueued_async",
    "enqueued",
    "enqueued_async",
    "refute_enqueued",
    "refute_enqueued_async",
    "run_jobs",
    "run_jobs_async",
]

_KindRef = type[BaseModel] | str | None


@overload
def enqueued(
    session: Session | scoped_session[Any],
    kind: _KindRef = None,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
) -> list[Job]: ...


@overload
def enqueued(
    session: AsyncSession | async_scoped_session[Any],
    kind: _KindRef = None,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
) -> Awaitable[list[Job]]: ...


def enqueued(
    session: Session | scoped_session[Any] | AsyncSession | async_scoped_session[Any],
    kind: _KindRef = None,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
) -> list[Job] | Awaitable[list[Job]]:
    """The pending jobs the test's transaction wrote (its uncommitted ones included), oldest
    first, optionally of one kind (a kind string, or a payload model registered with ``jobs``).

    ``all_jobs``: every pending job ``session`` can see. ``session`` may be a
    ``scoped_session``: its current ``Session`` is the one read. Flushes ``session``. Given an
    ``AsyncSession`` (or ``async_scoped_session``), returns an awaitable of the same list
    (:func:`enqueued_async`): ``await testing.enqueued(async_session)``.
    """
    if not isinstance(session, (Session, scoped_session)):
        return enqueued_async(session, kind, jobs=jobs, all_jobs=all_jobs)
    return _find(current(session), kind, jobs, all_jobs)[2]


async def enqueued_async(
    session: AsyncSession | async_scoped_session[Any],
    kind: _KindRef = None,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
) -> list[Job]:
    """:func:`enqueued` for an ``AsyncSession`` (or an ``async_scoped_session``)."""
    found = await current_async(session).run_sync(_find, kind, jobs, all_jobs)
    return found[2]


def assert_enqueued(
    session: Session | scoped_session[Any],
    kind: _KindRef,
    /,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
    **fields: Any,
) -> Job:
    """Assert that the test enqueued a pending job of ``kind`` whose payload has ``fields``
    (``assert_enqueued(session, "send_invoice", invoice_id=7)``); return the oldest such job,
    to check more of it (``queue``, ``run_at``, ``priority``).

    Fields compare as the payload model's attributes when the model is known (``kind`` is a
    model, or a kind string registered with ``jobs``), else as JSON values. Raises
    ``AssertionError`` listing the payloads of that kind the test did enqueue.
    """
    return _assert(_find(current(session), kind, jobs, all_jobs), fields, all_jobs)


async def assert_enqueued_async(
    session: AsyncSession | async_scoped_session[Any],
    kind: _KindRef,
    /,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
    **fields: Any,
) -> Job:
    """:func:`assert_enqueued` for an ``AsyncSession`` (or an ``async_scoped_session``)."""
    found = await current_async(session).run_sync(_find, kind, jobs, all_jobs)
    return _assert(found, fields, all_jobs)


def refute_enqueued(
    session: Session | scoped_session[Any],
    kind: _KindRef,
    /,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
    **fields: Any,
) -> None:
    """Assert that the test enqueued no pending job of ``kind`` whose payload has ``fields``
    (any job of ``kind``, without fields); fields compare as in :func:`assert_enqueued`."""
    _refute(_find(current(session), kind, jobs, all_jobs), fields)


async def refute_enqueued_async(
    session: AsyncSession | async_scoped_session[Any],
    kind: _KindRef,
    /,
    *,
    jobs: Jobs | None = None,
    all_jobs: bool = False,
    **fields: Any,
) -> None:
    """:func:`refute_enqueued` for an ``AsyncSession`` (or an ``async_scoped_session``)."""
    _refute(await current_async(session).run_sync(_find, kind, jobs, all_jobs), fields)


_Found = tuple[str | None, type[BaseModel] | None, list[Job]]


def _find(session: Session, kind: _KindRef, jobs: Jobs | None, all_jobs: bool) -> _Found:
    """The kind string, its payload model if known, and the pending jobs of that kind."""
    name: str | None
    model: type[BaseModel] | None = None
    if kind is None or isinstance(kind, str):
        name = kind
        registered = None if jobs is None or kind is None else jobs.kind_named(kind)
        model = None if registered is None else registered.model
    elif jobs is None:
        raise TypeError("pass jobs= to look a payload model up by its kind")
    else:
        name, model = jobs.by_model(kind).name, kind
    schema = None if jobs is None else jobs.schema
    opts = {} if schema is None else {"schema_translate_map": {None: schema}}
    params = {"kind": name, "any_kind": name is None, "all_jobs": all_jobs}
    session.flush()
    found = session.scalars(testing_sql.find_pending_for_testing(), params, execution_options=opts)
    return name, model, list(found)


def _matches(job: Job, model: type[BaseModel] | None, fields: dict[str, Any]) -> bool:
    if model is not None:
        unknown = sorted(set(fields) - set(model.model_fields))
        if unknown:
            raise TypeError(f"{model.__qualname__} has no field {', '.join(map(repr, unknown))}")
        try:
            payload = load_payload(model, job.payload)
        except ValidationError:
            return False
        return all(getattr(payload, k) == v for k, v in fields.items())
    return all(
        k in job.payload and job.payload[k] == to_jsonable_python(v) for k, v in fields.items()
    )


def _wanted(name: str | None, fields: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return f"{name or 'any kind'}({args})"


def _assert(found: _Found, fields: dict[str, Any], all_jobs: bool) -> Job:
    name, model, pending = found
    for job in pending:
        if _matches(job, model, fields):
            return job
    where = "visible" if all_jobs else "enqueued by this test's transaction (all_jobs=True: any)"
    seen = [job.payload for job in pending[:10]]
    raise AssertionError(
        f"no pending job {_wanted(name, fields)} {where}; of that kind: {seen or 'none'}"
        + (f" and {len(pending) - 10} more" if len(pending) > 10 else "")
    )


def _refute(found: _Found, fields: dict[str, Any]) -> None:
    name, model, pending = found
    for job in pending:
        if _matches(job, model, fields):
            raise AssertionError(
                f"job {job.id} {_wanted(name, fields)} was enqueued: payload {job.payload}"
            )


def run_jobs(
    jobs: Jobs,
    session: Session | scoped_session[Any],
    *,
    queues: list[str] | None = None,
    limit: int = 1000,
    raise_errors: bool = True,
    all_jobs: bool = False,
    include_delayed: bool = False,
    until: timedelta | float | None = None,
) -> RunResult:
    """Claim the due jobs the test's transaction wrote and run their handlers inline, in this
    thread, in that transaction: one claim per queue (``queues``, default: the registered kinds'
    queues) of up to ``limit`` jobs, keyed jobs within their concurrency limits.

    Job dependencies run in order in one call: the test's transaction never commits, so the
    triggers a commit would run are run before the first pass and after each pass that ended a
    parent (its children released, or cancelled if it ended dead or cancelled), and another pass
    runs the released ones, until a pass ends no parent.

    Which jobs: those ``session``'s transaction wrote, in it or in one of its savepoints (every
    due job it can see with ``all_jobs``); due now, or within ``until`` (a ``timedelta`` or
    seconds: time moved forward without sleeping), or at any time with ``include_delayed``.
    Backoffs and snoozes are still counted from the database's real ``now()``.

    Outcomes follow the worker's own rules (:mod:`sqla_jobs._outcome`): an unknown kind is a
    failure with backoff, a payload that no longer validates is dead, a handler's exception is a
    failure with the kind's backoff. They are written through ``session`` with the worker's
    statements. A handler that takes a session gets a ``Session`` joined to the test's
    transaction by a SAVEPOINT, so it sees the test's rows; its job completes in that savepoint,
    fenced on the lease, and its exception rolls its writes back to the savepoint before the
    failure is recorded; ``ctx.step`` is refused there, as in the worker. An async handler that
    takes a session needs :func:`run_jobs_async`.

    With ``raise_errors`` the first error is re-raised after its outcome is recorded (a
    handler's own exception, or :class:`JobFailed`); otherwise errors are collected in the
    result. ``session``'s objects are then expired if it expires them on commit: the handlers
    may have changed their rows. ``session`` may be a ``scoped_session``.
    """
    scope = Scope(queues, limit, raise_errors, all_jobs, include_delayed, until)
    return run(jobs, current(session), scope, Shell(wait=_wait))


async def run_jobs_async(
    jobs: Jobs,
    session: AsyncSession | async_scoped_session[Any],
    *,
    queues: list[str] | None = None,
    limit: int = 1000,
    raise_errors: bool = True,
    all_jobs: bool = False,
    include_delayed: bool = False,
    until: timedelta | float | None = None,
) -> RunResult:
    """:func:`run_jobs` for an ``AsyncSession`` (or an ``async_scoped_session``), on the running
    event loop: an async handler that takes a session gets an ``AsyncSession`` joined to the
    test's transaction by a SAVEPOINT (a sync one, a ``Session``)."""
    scope = Scope(queues, limit, raise_errors, all_jobs, include_delayed, until)
    resolved = current_async(session)
    conn = await resolved.connection()
    shell = Shell(wait=await_only, async_conn=conn, loop=asyncio.get_running_loop())
    return await resolved.run_sync(lambda sync: run(jobs, sync, scope, shell))


def _wait(value: Awaitable[Any]) -> Any:
    """Run an async handler's awaitable to its end, from the sync shell."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(value))
    if asyncio.iscoroutine(value):
        value.close()  # never to be awaited: say so now rather than warn at collection
    raise ConfigurationError(
        "testing.run_jobs ran an async handler inside a running event loop; use "
        "`await testing.run_jobs_async(jobs, async_session)` there"
    )


async def _await(value: Awaitable[Any]) -> Any:
    return await value
