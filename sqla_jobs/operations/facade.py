"""The operations half of the ``Jobs`` facade: retry, cancel, delete, get; pause, resume and forget a
queue; sync and async, each in the caller's own transaction (see :mod:`sqla_jobs.operations.jobs` for the rules)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, scoped_session

from sqla_jobs.db.sessions import current, current_async
from sqla_jobs.model import Job
from sqla_jobs.operations import jobs as _ops
from sqla_jobs.operations import queues as _queues
from sqla_jobs.operations import results as _results
from sqla_jobs.operations.jobs import CancelResult
from sqla_jobs.operations.queues import QueueChange

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session


class Operations:
    """Mixed into :class:`~sqla_jobs.Jobs`: ``schema``, ``channel`` and ``cancel_channel`` come
    from there."""

    schema: str | None
    channel: str
    cancel_channel: str

    @property
    def _scope(self) -> _ops.Scope:
        return _ops.Scope(self.schema, self.channel, self.cancel_channel)

    def retry(
        self,
        session: Session | scoped_session[Any],
        ids: _ops.Ids = None,
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> list[int]:
        """Run jobs again as soon as possible; returns the ids changed.

        ``ids``: dead, cancelled, or pending-not-yet-due jobs. Without ``ids``: the dead jobs of
        ``kind`` and ``queue`` (either or both; at most 10,000 per call). Each goes back to
        ``pending`` at the database's ``now()`` with both budgets whole again (``attempts``,
        ``crashes`` and ``interruptions`` at 0) and its cancel request cleared; ``errors`` and
        ``last_error`` stay, for the record. Workers are woken at commit. An unknown id raises
        :class:`~sqla_jobs.JobNotFoundError`, a running or completed job
        :class:`~sqla_jobs.JobStateError`, before anything changed: the transaction stays usable.
        A unique job whose key another job holds now (or that shares its key with a lower id of
        ``ids``) raises :class:`~sqla_jobs.UniqueKeyTakenError` likewise; without ``ids``, such
        jobs stay dead and the others are retried.

        ``ids`` may also be a SELECT of job ids, run in ``session`` as written (for instance the
        jobs linked to a row: ``select(order_jobs.c.job_id).where(order_jobs.c.order_id == 42)``):
        a filter like ``kind`` and ``queue``, so it retries the dead jobs among them (ids of jobs
        gone or in another state are no error), at most 10,000 per call.
        """
        return _ops.retry(current(session), self._scope, ids, kind=kind, queue=queue)

    async def retry_async(
        self,
        session: AsyncSession | async_scoped_session[Any],
        ids: _ops.Ids = None,
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> list[int]:
        """:meth:`retry` for an ``AsyncSession``."""
        return await current_async(session).run_sync(
            lambda s: _ops.retry(s, self._scope, ids, kind=kind, queue=queue)
        )

    def cancel(
        self,
        session: Session | scoped_session[Any],
        ids: _ops.Ids = None,
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> CancelResult:
        """Cancel jobs: a pending one is ``cancelled`` and never runs; a running one's worker is
        told at commit (NOTIFY; its heartbeat is the floor) and stops it: an async handler is
        cancelled, a sync one sees ``ctx.cancelled``. The run then ends ``cancelled``, never
        retried (a handler that returns normally anyway completes). The request is stored with
        the job, so a worker that dies meanwhile cannot put it back in the queue.

        ``ids``: pending or running jobs; without ``ids``: those of ``queue`` and ``kind``. Errors
        as for :meth:`retry`, raised before anything changed. A SELECT of job ids is a filter, as
        for :meth:`retry`: it cancels the pending and running jobs among them.
        A ``waiting`` job (``depends_on``) is cancelled as a pending one is; a job that others
        depend on cancels them too, and theirs, at the commit (unless they were enqueued with
        ``on_parent_failure="run"``); a child's cancel changes nothing for its parents. Retrying
        a cancelled or dead job later does not bring back the dependents it cancelled.
        """
        return _ops.cancel(current(session), self._scope, ids, kind=kind, queue=queue)

    async def cancel_async(
        self,
        session: AsyncSession | async_scoped_session[Any],
        ids: _ops.Ids = None,
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> CancelResult:
        """:meth:`cancel` for an ``AsyncSession``."""
        return await current_async(session).run_sync(
            lambda s: _ops.cancel(s, self._scope, ids, kind=kind, queue=queue)
        )

    def delete(
        self,
        session: Session | scoped_session[Any],
        ids: _ops.Ids = None,
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> list[int]:
        """Delete finished jobs for good; returns the ids deleted.

        ``ids``: dead, cancelled or kept ``completed`` jobs. Without ``ids``: the dead jobs of
        ``kind`` and ``queue`` (at most 10,000 per call); a SELECT of job ids is a filter, as for
        :meth:`retry`. Errors as for :meth:`retry` (an unknown id, a pending or running job: use
        :meth:`cancel` first), raised before anything changed; a job still referenced by a row of
        the application's (a foreign key that does not cascade) raises
        :class:`~sqla_jobs.JobReferencedError`, nothing deleted, the transaction still usable.
        Deleted in the caller's transaction: a rollback brings them back.
        """
        return _ops.delete(current(session), self._scope, ids, kind=kind, queue=queue)

    async def delete_async(
        self,
        session: AsyncSession | async_scoped_session[Any],
        ids: _ops.Ids = None,
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> list[int]:
        """:meth:`delete` for an ``AsyncSession``."""
        return await current_async(session).run_sync(
            lambda s: _ops.delete(s, self._scope, ids, kind=kind, queue=queue)
        )

    def pause_queue(
        self, session: Session | scoped_session[Any], name: str, *, known_only: bool = False
    ) -> QueueChange:
        """Stop every worker from claiming from queue ``name``, from their next claim after the
        commit on, until :meth:`resume_queue`. Stored in the database: it holds across worker
        restarts and for workers started later. Running jobs finish; enqueue still works.

        A queue may be paused before its first job exists (its row is created). Pausing a paused
        queue changes nothing and keeps its first time (``changed`` False). With ``known_only``,
        a queue that is not paused and that :meth:`known_queues` does not list raises
        :class:`~sqla_jobs.UnknownQueueError` before anything changed: for a name typed by a
        person. Returns the queue's state after the call."""
        return _queues.pause(current(session), self._scope, name, known_only=known_only)

    async def pause_queue_async(
        self,
        session: AsyncSession | async_scoped_session[Any],
        name: str,
        *,
        known_only: bool = False,
    ) -> QueueChange:
        """:meth:`pause_queue` for an ``AsyncSession``."""
        return await current_async(session).run_sync(
            lambda s: _queues.pause(s, self._scope, name, known_only=known_only)
        )

    def resume_queue(self, session: Session | scoped_session[Any], name: str) -> QueueChange:
        """Let workers claim from queue ``name`` again; they are woken at commit. A queue that is
        not paused is left as it is (``changed`` False; no row is created for it)."""
        return _queues.resume(current(session), self._scope, name)

    async def resume_queue_async(
        self, session: AsyncSession | async_scoped_session[Any], name: str
    ) -> QueueChange:
        """:meth:`resume_queue` for an ``AsyncSession``."""
        return await current_async(session).run_sync(lambda s: _queues.resume(s, self._scope, name))

    def forget_queue(
        self, session: Session | scoped_session[Any], name: str, *, force: bool = False
    ) -> bool:
        """Delete queue ``name``'s stored row (its pause and when it was last changed), so that a
        queue no longer used leaves the listings. Returns False if there was no row.

        A paused queue that jobs, a schedule or a live worker still name is refused
        (:class:`~sqla_jobs.QueueInUseError`, nothing changed), since forgetting its row resumes
        it; ``force`` forgets it anyway and wakes its workers at commit. Forgetting a paused queue
        nothing names (a typo) needs no ``force``."""
        return _queues.forget(current(session), self._scope, name, force=force)

    async def forget_queue_async(
        self,
        session: AsyncSession | async_scoped_session[Any],
        name: str,
        *,
        force: bool = False,
    ) -> bool:
        """:meth:`forget_queue` for an ``AsyncSession``."""
        return await current_async(session).run_sync(
            lambda s: _queues.forget(s, self._scope, name, force=force)
        )

    def known_queues(self, session: Session | scoped_session[Any]) -> list[str]:
        """The queues the database knows of, by name: those with pending or running jobs, with
        jobs finished in the last 7 days (as far as the throughput counts are kept), of a
        schedule's last job, served by a live worker, or with a stored row (paused, or resumed
        and not forgotten). Reads indexes and small tables only, never every job; dead and
        cancelled jobs older than the throughput counts do not make a queue known. No locks."""
        return _queues.known(current(session), self._scope)

    def get(self, session: Session | scoped_session[Any], job_id: int) -> Job | None:
        """The job ``job_id`` as ``session``'s transaction sees it, or None (a job that
        completed is gone, unless its row had to be kept)."""
        return _ops.get(current(session), self._scope, job_id)

    async def get_async(
        self, session: AsyncSession | async_scoped_session[Any], job_id: int
    ) -> Job | None:
        """:meth:`get` for an ``AsyncSession``."""
        return await current_async(session).run_sync(lambda s: _ops.get(s, self._scope, job_id))

    def result(self, session: Session | scoped_session[Any], job_id: int) -> Any:
        """What the handler of job ``job_id`` returned, for a kind with ``results=True``: stored
        with its completion (in JSON form: a pydantic model as its ``model_dump(mode="json")``)
        and kept as long as outcomes are (the retention of dead jobs). Raises
        :class:`~sqla_jobs.NoResultError` if there is none: not completed (yet), a kind that
        stores no results, or pruned. A result may be JSON ``null``: then this returns None."""
        return _results.result(current(session), self._scope, job_id)

    async def result_async(
        self, session: AsyncSession | async_scoped_session[Any], job_id: int
    ) -> Any:
        """:meth:`result` for an ``AsyncSession``."""
        return await current_async(session).run_sync(
            lambda s: _results.result(s, self._scope, job_id)
        )
