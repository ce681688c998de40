"""The pages: every one a GET that reads in one short transaction and changes nothing.

Queues (depth by state, oldest due age, paused or not), jobs by state, queue and kind (paged by
id), one job, the live workers, and the last hour's throughput. Each endpoint is a plain
function that Starlette runs in its thread pool, since the Session is a synchronous one.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

from sqlalchemy import Row
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sqla_jobs.dashboard import _chart, _reads, _series
from sqla_jobs.dashboard._render import Dashboard, link, seconds
from sqla_jobs.model import STATES, Job, JobState
from sqla_jobs.observe import throughput
from sqla_jobs.observe.stale import StaleHolder
from sqla_jobs.operations.jobs import CANCELLABLE, DELETABLE, RETRYABLE
from sqla_jobs.operations.relatives import Relatives, relatives

#: The files under static/ the app serves, read once, with their media types.
_STATIC = {
    name: ((resources.files("sqla_jobs.dashboard") / "static" / name).read_bytes(), media_type)
    for name, media_type in (
        ("dashboard.css", "text/css"),
        ("favicon.svg", "image/svg+xml"),
        ("favicon.ico", "image/vnd.microsoft.icon"),
    )
}
_UNDEFINED_TABLE = "42P01"


#: Each verb the dashboard offers and the states it offers it for: those the operation accepts,
#: but retry not for a pending job, where "Retry" would read as a fix for a job that never failed.
_OFFERED = (
    ("retry", tuple(s for s in RETRYABLE if s != JobState.PENDING.value)),
    ("delete", DELETABLE),
    ("cancel", CANCELLABLE),
)


def actions_for(state: str) -> tuple[str, ...]:
    """The actions the dashboard offers for a job in ``state``."""
    return tuple(verb for verb, states in _OFFERED if state in states)


def bulk_actions(state: str | None, shown: Iterable[str]) -> tuple[str, ...]:
    """The actions offered for the ticked jobs of a listing: those of its ``state`` filter, else
    each that applies to one of the states ``shown`` (the operation names any ticked job it
    does not apply to, and changes nothing)."""
    states = {state} if state else set(shown)
    return tuple(verb for verb, applies in _OFFERED if states.intersection(applies))


class Pages:
    """The GET endpoints of one dashboard."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    def queues(self, request: Request) -> Response:
        jobs = self.dash.jobs
        queues, kinds, limiters = self.dash.reads.read(
            request,
            lambda s: (_reads.queues(s, jobs), _reads.kinds(s, jobs), _reads.limiters(s, jobs)),
        )
        return self.dash.page(
            request,
            "queues.html",
            {
                "queues": queues,
                "kinds": kinds,
                "states": STATES,
                "limiters": limiters[: _reads.LIMITERS_SHOWN],
                "more_limiters": max(0, len(limiters) - _reads.LIMITERS_SHOWN),
            },
            nav="queues",
        )

    def jobs(self, request: Request) -> Response:
        where = _reads.JobFilter.parse(request.query_params)
        jobs = self.dash.jobs

        def read(session: Session) -> tuple[list[Row[Any]], int | None, dict[int, StaleHolder]]:
            rows, older = _reads.job_page(session, jobs, where)
            return rows, older, _reads.stale(session, jobs, rows)

        rows, older, stale = self.dash.reads.read(request, read)
        nav = "jobs"
        if where.state in ("dead", "running") and not (where.queue or where.kind):
            nav = where.state
        return self.dash.page(
            request,
            "jobs.html",
            {
                "rows": rows,
                "where": where,
                "older": older,
                "states": STATES,
                "actions_for": actions_for,
                "bulk": bulk_actions(where.state, (r.state for r in rows)),
                "stale": stale,
            },
            nav=nav,
        )

    def job(self, request: Request) -> Response:
        job_id = _reads.job_id(request.path_params["job_id"])

        def read(session: Session) -> tuple[Job | None, Relatives | None]:
            found = self.dash.jobs.get(session, job_id)
            if found is None:
                return None, None
            return found, relatives(session, self.dash.jobs.schema, job_id)

        job, family = self.dash.reads.read(request, read)
        if job is None:
            return self._not_found(request, job_id)
        return self.dash.page(
            request,
            "job.html",
            {
                "job": job,
                "family": family,
                "actions": actions_for(job.state),
                "show_payload": self.dash.show_payload,
                "errors": list(reversed(job.errors or [])),
                "steps": job.steps or {},
            },
            nav="jobs",
        )

    def search(self, request: Request) -> Response:
        job_id = _reads.job_id(request.query_params.get("id", ""))
        found: Job | None = self.dash.reads.read(request, lambda s: self.dash.jobs.get(s, job_id))
        if found is None:
            return self._not_found(request, job_id)
        return RedirectResponse(link(request, f"/jobs/{job_id}"), status_code=303)

    def _not_found(self, request: Request, job_id: int) -> Response:
        return self.dash.page(
            request,
            "message.html",
            {
                "heading": "Job not found",
                "text": f"No job has id {job_id}. A job that completed is deleted (unless its "
                "row had to be kept), and finished jobs are pruned after their retention.",
            },
            status=404,
        )

    def workers(self, request: Request) -> Response:
        workers = self.dash.reads.read(request, lambda s: _reads.workers(s, self.dash.jobs))
        return self.dash.page(request, "workers.html", {"workers": workers}, nav="workers")

    def throughput(self, request: Request) -> Response:
        queue = _reads.name("queue", request.query_params.get("queue"))
        try:
            minutes, now = self.dash.reads.read(
                request,
                lambda s: (
                    throughput.recent(s, self.dash.jobs, minutes=_series.SPAN),
                    _reads.database_now(s),
                ),
            )
        except ProgrammingError as exc:
            if getattr(exc.orig, "sqlstate", None) != _UNDEFINED_TABLE:
                raise
            first = str(exc.orig).strip().splitlines()[0]
            return self.dash.page(
                request,
                "message.html",
                {
                    "heading": "No throughput table",
                    "text": f"{first}: the database predates the throughput table. Run "
                    "sqla-jobs migrate (or alembic upgrade heads); the workers then fill it.",
                },
                status=503,
                nav="throughput",
            )
        hour = _series.hour(minutes, now, queue)
        return self.dash.page(
            request,
            "throughput.html",
            {
                "hour": hour,
                "queue": queue,
                "charts": _charts(hour),
                "outcomes": _series.OUTCOMES,
            },
            nav="throughput",
        )

    def static(self, request: Request) -> Response:
        """One of the :data:`_STATIC` files, by the name in the path (or the route's own)."""
        name = request.path_params.get("name") or "favicon.ico"
        found = _STATIC.get(name)
        if found is None:
            raise HTTPException(404)
        content, media_type = found
        return Response(content, media_type=media_type)


def _charts(hour: _series.Hour) -> dict[str, Any]:
    return {
        "outcomes": _chart.stacked_bars(
            hour.slots,
            [(o, hour.outcomes[o]) for o in _series.OUTCOMES],
            label="Runs ended per minute, by outcome",
        ),
        "latency": _chart.lines(
            hour.slots,
            [("pickup", hour.mean_pickup), ("run", hour.mean_run)],
            label="Mean pickup delay and mean run time per minute",
            fmt=seconds,
        ),
    }
