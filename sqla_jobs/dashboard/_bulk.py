"""Retry, delete or cancel every job a filter matches, in two POSTs: count, then confirm.

The first POST (``/jobs/{verb}/matching`` with ``queue`` and ``kind``) changes nothing: it counts
what the operation would touch (:mod:`sqla_jobs.operations.preview`, the operation's own filter)
and answers with a confirmation page, rendered on the server (the CSP allows no script), saying
how many jobs, which filter, which ids and the per-run cap. Its form carries what was counted (the
highest id and the number) signed with the app's secret and bound to the browser's CSRF cookie;
the second POST runs the operation only with that signature intact, and bounded to it: jobs with
ids up to the highest counted, no more of them than were counted. If more jobs match within that
bound now than were counted, nothing runs and the page asks again with the new count.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sqla_jobs.dashboard import _reads
from sqla_jobs.dashboard._actions import JOB_VERBS, Actions, _cancelled, _next
from sqla_jobs.dashboard._csrf import FIELD
from sqla_jobs.dashboard._flash import Flash
from sqla_jobs.dashboard._render import link
from sqla_jobs.operations import jobs as _ops
from sqla_jobs.operations.jobs import Bound, said
from sqla_jobs.operations.preview import Preview, preview

#: What the signature of a confirmation form is for (a signature of another form is no use here).
PURPOSE = "bulk"


class _Stale(Exception):
    """More jobs match within the confirmed bound than were counted: nothing ran."""

    def __init__(self, counted: Preview) -> None:
        super().__init__(counted.verb)
        self.counted = counted


class Bulk:
    """The by-filter POST endpoint of one dashboard, on top of its :class:`Actions`."""

    def __init__(self, actions: Actions) -> None:
        self.actions = actions
        self.dash = actions.dash

    async def matching(self, request: Request) -> Response:
        verb = request.path_params["verb"]
        if verb not in JOB_VERBS:
            raise HTTPException(404)
        actions = self.actions
        if self.dash.read_only:
            return actions._refuse(request, verb, "this dashboard is read-only", "")
        form = await request.form()
        refusal = self.dash.csrf.refusal(request, form.get(FIELD))
        if refusal is not None:
            return actions._refuse(request, verb, refusal, " Reload the page and try again.")
        try:
            queue, kind = _filter(verb, form)
            confirmed = _confirmed(form)
        except _reads.BadRequest as exc:
            return self._back(request, form, Flash("error", f"{verb}: {exc}: nothing changed"))
        if confirmed is None:
            counted = await run_in_threadpool(self._count, verb, queue, kind)
            return self._confirmation(request, form, counted, "")
        parts = _parts(verb, queue, kind, confirmed)
        if not self.dash.csrf.verified(request, form.get("confirm"), PURPOSE, *parts):
            return actions._refuse(
                request,
                verb,
                "the confirmation does not match what was counted",
                " Start again from the jobs page.",
            )

        def run(session: Session) -> str:
            return _run(session, self.dash.jobs._scope, verb, queue, kind, confirmed)

        try:
            flash = await run_in_threadpool(actions._run, request, verb, run)
        except _Stale as stale:
            note = (
                f"More jobs match now than the {confirmed.limit:,} you confirmed: nothing "
                "changed. Here is the new count."
            )
            return self._confirmation(request, form, stale.counted, note, status=409)
        return self._back(request, form, flash)

    def _count(self, verb: str, queue: str | None, kind: str | None) -> Preview:
        with self.dash.session() as session, session.begin():
            return preview(session, self.dash.jobs._scope, verb, kind=kind, queue=queue)

    def _confirmation(
        self, request: Request, form: FormData, counted: Preview, note: str, status: int = 200
    ) -> Response:
        bound = counted.bound()
        nonce, _ = self.dash.csrf.nonce(request)
        parts = _parts(counted.verb, counted.queue, counted.kind, bound)
        context: dict[str, Any] = {
            "verb": counted.verb,
            "counted": counted,
            "bound": bound,
            "note": note,
            "back": _next(form),
            "signature": self.dash.csrf.signed(nonce, PURPOSE, *parts),
        }
        return self.dash.page(request, "confirm.html", context, status=status)

    def _back(self, request: Request, form: FormData, flash: Flash) -> Response:
        response = RedirectResponse(link(request, _next(form)), status_code=303)
        self.dash.flashes.put(request, response, flash)
        return response


def _filter(verb: str, form: FormData) -> tuple[str | None, str | None]:
    """The form's queue and kind; a cancel by filter needs the queue, as the CLI's does."""
    queue = _reads.name("queue", _text(form.get("queue")))
    kind = _reads.name("kind", _text(form.get("kind")))
    if verb == "cancel" and queue is None:
        raise _reads.BadRequest("cancel every job of a filter needs a queue")
    return queue, kind


def _confirmed(form: FormData) -> Bound | None:
    """The bound a confirmation form carries (the highest id counted and how many), or None on
    the first POST."""
    if form.get("confirm") is None:
        return None
    try:
        max_id, limit = int(_text(form.get("max_id")) or ""), int(_text(form.get("counted")) or "")
    except ValueError:
        raise _reads.BadRequest("the confirmation form is incomplete") from None
    if not (0 <= max_id <= _reads.MAX_ID and 0 <= limit <= _ops.FILTER_LIMIT):
        raise _reads.BadRequest("the confirmation form is out of range")
    return Bound(max_id=max_id, limit=limit)


def _parts(verb: str, queue: str | None, kind: str | None, bound: Bound) -> tuple[str, ...]:
    return (verb, queue or "", kind or "", str(bound.max_id), str(bound.limit))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _run(
    session: Session,
    scope: _ops.Scope,
    verb: str,
    queue: str | None,
    kind: str | None,
    bound: Bound,
) -> str:
    """Run ``verb`` by filter within ``bound`` after checking, in the same transaction, that no
    more jobs match within it than were counted (:class:`_Stale` if they do: nothing ran)."""
    now = preview(session, scope, verb, kind=kind, queue=queue, max_id=bound.max_id)
    if now.total > bound.limit:
        raise _Stale(preview(session, scope, verb, kind=kind, queue=queue))
    if verb == "retry":
        result = _ops.retry_detail(session, scope, None, kind=kind, queue=queue, bound=bound)
        done = said("retried", result.retried) if result.retried else "no dead jobs to retry"
        if result.kept:
            done += f"; kept {len(result.kept)} dead, their unique key held by another job"
        return done
    if verb == "delete":
        deleted = _ops.delete(session, scope, None, kind=kind, queue=queue, bound=bound)
        return said("deleted", deleted) if deleted else "no dead jobs to delete"
    return _cancelled(_ops.cancel(session, scope, None, kind=kind, queue=queue, bound=bound))
