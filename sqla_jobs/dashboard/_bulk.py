"""Retry, delete or cancel every job a filter matches, in two POSTs: count, then confirm.

The first POST (``/jobs/{verb}/matching`` with ``queue`` and ``kind``) changes nothing: it counts
what the operation would touch (:mod:`sqla_jobs.operations.preview`, the operation's own filter)
and answers with a confirmation page, rendered on the server (the CSP allows no script), saying
how many jobs, which filter, which ids and the per-run cap. Its form carries what was counted (the
highest id, the number, a fingerprint of the ids) and when, signed with the app's secret and bound
to the browser's CSRF cookie; the second POST runs the operation only with that signature intact,
within :data:`FRESH` seconds, and on exactly the jobs counted: it counts again in its own
transaction, and if the jobs matching within the bound are not the ones counted (one matches
since, one no longer does), nothing runs and the page asks again with the new count.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqla_jobs.dashboard import _reads
from sqla_jobs.dashboard._actions import JOB_VERBS, Actions, _cancelled, _next
from sqla_jobs.dashboard._flash import Flash
from sqla_jobs.operations import jobs as _ops
from sqla_jobs.operations.jobs import Bound, said
from sqla_jobs.operations.preview import Preview, preview

#: What the signature of a confirmation form is for (a signature of another form is no use here).
PURPOSE = "bulk"
#: Seconds a confirmation stays good: a page kept open, or sent again, counts afresh after that.
FRESH = 600
#: The clock a confirmation's age is read on (a test moves it).
_clock = time.time


class _Confirmed(NamedTuple):
    """What a confirmation form says was counted, and when (epoch seconds)."""

    bound: Bound
    digest: str
    issued: int


class _Stale(Exception):
    """The jobs matching within the confirmed bound are not the ones counted: nothing ran."""

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
        form = await actions._form(request, verb)
        if isinstance(form, Response):
            return form
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
        if not 0 <= _clock() - confirmed.issued <= FRESH:
            counted = await run_in_threadpool(self._count, verb, queue, kind)
            note = (
                f"That confirmation is more than {FRESH // 60} minutes old: nothing changed. "
                "Here is the new count."
            )
            return self._confirmation(request, form, counted, note, status=409)

        def run(session: Session) -> str:
            return _run(session, self.dash.jobs._scope, verb, queue, kind, confirmed)

        try:
            flash = await run_in_threadpool(actions._run, request, verb, run)
        except _Stale as stale:
            note = (
                "The jobs matching now are not the ones you confirmed: nothing changed. Here is "
                "the new count."
            )
            return self._confirmation(request, form, stale.counted, note, status=409)
        return self._back(request, form, flash)

    def _count(self, verb: str, queue: str | None, kind: str | None) -> Preview:
        with self.dash.session() as session, session.begin():
            return preview(session, self.dash.jobs._scope, verb, kind=kind, queue=queue)

    def _confirmation(
        self, request: Request, form: FormData, counted: Preview, note: str, status: int = 200
    ) -> Response:
        confirmed = _Confirmed(counted.bound(), counted.digest(), int(_clock()))
        nonce, _ = self.dash.csrf.nonce(request)
        parts = _parts(counted.verb, counted.queue, counted.kind, confirmed)
        context: dict[str, Any] = {
            "verb": counted.verb,
            "counted": counted,
            "confirmed": confirmed,
            "note": note,
            "back": _next(form),
            "signature": self.dash.csrf.signed(nonce, PURPOSE, *parts),
        }
        return self.dash.page(request, "confirm.html", context, status=status)

    def _back(self, request: Request, form: FormData, flash: Flash) -> Response:
        return self.actions.back(request, form, flash)


def _filter(verb: str, form: FormData) -> tuple[str | None, str | None]:
    """The form's queue and kind; a cancel by filter needs the queue, as the CLI's does."""
    queue = _reads.name("queue", _text(form.get("queue")))
    kind = _reads.name("kind", _text(form.get("kind")))
    if verb == "cancel" and queue is None:
        raise _reads.BadRequest("cancel every job of a filter needs a queue")
    return queue, kind


def _confirmed(form: FormData) -> _Confirmed | None:
    """What a confirmation form carries (the highest id counted, how many, their fingerprint
    and when), or None on the first POST."""
    if form.get("confirm") is None:
        return None
    try:
        max_id, limit = int(_text(form.get("max_id")) or ""), int(_text(form.get("counted")) or "")
        issued = int(_text(form.get("issued")) or "")
    except ValueError:
        raise _reads.BadRequest("the confirmation form is incomplete") from None
    digest = _text(form.get("digest")) or ""
    if not (0 <= max_id <= _reads.MAX_ID and 0 <= limit <= _ops.FILTER_LIMIT):
        raise _reads.BadRequest("the confirmation form is out of range")
    return _Confirmed(Bound(max_id=max_id, limit=limit), digest, issued)


def _parts(
    verb: str, queue: str | None, kind: str | None, confirmed: _Confirmed
) -> tuple[str, ...]:
    bound = confirmed.bound
    return (
        verb,
        queue or "",
        kind or "",
        str(bound.max_id),
        str(bound.limit),
        confirmed.digest,
        str(confirmed.issued),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _run(
    session: Session,
    scope: _ops.Scope,
    verb: str,
    queue: str | None,
    kind: str | None,
    confirmed: _Confirmed,
) -> str:
    """Run ``verb`` on the jobs counted, after checking in the same transaction that the jobs
    matching within the bound are still those (:class:`_Stale` if not: nothing ran)."""
    now = preview(session, scope, verb, kind=kind, queue=queue, max_id=confirmed.bound.max_id)
    if now.digest() != confirmed.digest or now.total > confirmed.bound.limit:
        raise _Stale(preview(session, scope, verb, kind=kind, queue=queue))
    bound = now.bound()
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
