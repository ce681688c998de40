"""The actions: retry, delete and cancel jobs, pause and resume a queue. Each is a POST that
passes the CSRF check (:mod:`._csrf`), runs one call of the operations API (``jobs.retry``,
``jobs.delete``, ``jobs.cancel``, ``jobs.pause_queue``, ``jobs.resume_queue``) in a transaction
of its own, and redirects back (303) with a flash saying what changed.

A refused operation (``OperationError``: an unknown id, a job in the wrong state, a unique key
taken) changes nothing, since the API checks before its first write; so does a database role
without the privilege (docs/roles.md: the operator role has them). Both become the flash, never
an error page. A read-only dashboard answers every one of these with 403 before reading anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from psycopg import errors as pg_errors
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sqla_jobs.dashboard import _reads
from sqla_jobs.dashboard._csrf import FIELD
from sqla_jobs.dashboard._flash import Flash
from sqla_jobs.dashboard._render import Dashboard, link
from sqla_jobs.dashboard._security import USER_KEY, client_address
from sqla_jobs.errors import OperationError, UnknownQueueError
from sqla_jobs.jobs import Jobs
from sqla_jobs.operations.jobs import RUNNING_CANCEL_NOTE, said

log = logging.getLogger("sqla_jobs.dashboard")

JOB_VERBS = ("retry", "delete", "cancel")
QUEUE_VERBS = ("pause", "resume")
#: The most jobs one form may name (a page of the listing holds fewer).
MAX_IDS = 1000


def _next(form: FormData) -> str:
    """Where to go back to: a path of this app from the form, else the queues page. Never
    another site: the value must be a path (``/...``), not ``//host`` nor a URL."""
    value = form.get("next")
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return "/"
    if "\\" in value or any(ord(c) < 32 for c in value):
        return "/"
    return value


def _ids(form: FormData) -> list[int]:
    """The jobs a form names: the row's button (``job``), else the ticked boxes (``ids``)."""
    one = form.get("job")
    values = [one] if one else form.getlist("ids")
    if not values:
        raise _reads.BadRequest("no job selected: tick the jobs first")
    if len(values) > MAX_IDS:
        raise _reads.BadRequest(f"too many jobs at once: at most {MAX_IDS}")
    return [_reads.job_id(v) for v in values]


def _cancelled(result: Any) -> str:
    parts = []
    if result.cancelled:
        parts.append(said("cancelled", result.cancelled, "pending job"))
    if result.requested:
        parts.append(
            said("asked the workers to stop", result.requested, "running job") + RUNNING_CANCEL_NOTE
        )
    return "; ".join(parts) or "nothing to cancel"


def _check_listed(session: Session, jobs: Jobs, queue: str) -> None:
    # The page offers Pause on the queues it lists, and only those: a forged form naming any
    # other would pause a name into existence, which the CLI refuses too.
    listed = list(_reads.queues(session, jobs))
    if queue not in listed:
        raise UnknownQueueError(
            f"unknown queue {queue!r}: no job, schedule or live worker names it (known queues: "
            f"{', '.join(listed) or 'none'}): nothing changed",
            queue,
            listed,
        )


class Actions:
    """The POST endpoints of one dashboard."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    async def jobs(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        if verb not in JOB_VERBS:
            raise HTTPException(404)
        jobs = self.dash.jobs

        def operation(form: FormData) -> Callable[[Session], str]:
            ids = _ids(form)
            if verb == "retry":
                return lambda s: said("retried", jobs.retry(s, ids))
            if verb == "delete":
                return lambda s: said("deleted", jobs.delete(s, ids))
            return lambda s: _cancelled(jobs.cancel(s, ids))

        return await self._perform(request, verb, operation)

    async def queue(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        if verb not in QUEUE_VERBS:
            raise HTTPException(404)
        jobs = self.dash.jobs

        def operation(form: FormData) -> Callable[[Session], str]:
            queue = _reads.name("queue", request.path_params["queue"])
            assert queue is not None  # the route's path has one

            def run(session: Session) -> str:
                if verb == "pause":
                    _check_listed(session, jobs, queue)
                    change = jobs.pause_queue(session, queue)
                    if not change.changed:
                        return f"queue {queue} is already paused (since {change.paused_at:%Y-%m-%d %H:%M:%S %Z})"
                    return (
                        f"paused queue {queue}: workers claim none of its jobs until it is resumed"
                    )
                if jobs.resume_queue(session, queue).changed:
                    return f"resumed queue {queue}"
                return f"queue {queue} was not paused"

            return run

        return await self._perform(request, verb, operation)

    async def _perform(
        self,
        request: Request,
        verb: str,
        operation: Callable[[FormData], Callable[[Session], str]],
    ) -> Response:
        form = await self._form(request, verb)
        if isinstance(form, Response):
            return form
        try:
            run = operation(form)
        except _reads.BadRequest as exc:
            flash = Flash("error", f"{verb}: {exc}: nothing changed")
        else:
            flash = await run_in_threadpool(self._run, request, verb, run)
        return self.back(request, form, flash)

    def back(self, request: Request, form: FormData, flash: Flash) -> Response:
        """The redirect back to the page the form came from, with ``flash`` and, after a change,
        the mark that sends the next pages' reads where they see it (:mod:`._replica`)."""
        response = RedirectResponse(link(request, _next(form)), status_code=303)
        self.dash.flashes.put(request, response, flash)
        self.dash.reads.remember(request, response, getattr(request.state, "written", None))
        return response

    def _run(self, request: Request, verb: str, run: Callable[[Session], str]) -> Flash:
        who = f"user {request.scope.get(USER_KEY) or '-'}, client {client_address(request.scope)}"
        try:
            with self.dash.session() as session:
                with session.begin():
                    done = run(session)
                request.state.written = self.dash.reads.written(session)
        except OperationError as exc:
            log.info("%s refused: %s (%s)", verb, exc, who, extra={"event": "dashboard_refused"})
            return Flash("error", str(exc))
        except DBAPIError as exc:
            if not isinstance(exc.orig, pg_errors.InsufficientPrivilege):
                raise
            first = str(exc.orig).strip().splitlines()[0]
            log.warning(
                "%s refused by the database: %s (%s)",
                verb,
                first,
                who,
                extra={"event": "dashboard_refused"},
            )
            return Flash(
                "error",
                f"{verb}: the dashboard's database role may not do this ({first}): connect it as "
                "the operator role of docs/roles.md, or run it read-only. Nothing changed.",
            )
        log.info("%s (%s)", done, who, extra={"event": f"dashboard_{verb}"})
        return Flash("ok", done)

    async def _form(self, request: Request, verb: str) -> FormData | Response:
        """The POST's form, or the refusal to send instead (a read-only dashboard, a bad or
        missing CSRF token): every action's first step."""
        if self.dash.read_only:
            return self._refuse(request, verb, "this dashboard is read-only", "")
        form = await request.form()
        refusal = self.dash.csrf.refusal(request, form.get(FIELD))
        if refusal is not None:
            return self._refuse(request, verb, refusal, " Reload the page and try again.")
        return form

    def _refuse(self, request: Request, verb: str, why: str, hint: str) -> Response:
        log.warning(
            "%s %s refused: %s (user %s, client %s)",
            request.method,
            verb,
            why,
            request.scope.get(USER_KEY) or "-",
            client_address(request.scope),
            extra={"event": "dashboard_refused"},
        )
        return self.dash.page(
            request,
            "message.html",
            {"heading": "Refused", "text": f"Nothing changed: {why}.{hint}"},
            status=403,
        )
