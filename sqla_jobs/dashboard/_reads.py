"""What the pages read, through the queue statistics the CLI prints (``sqla_jobs.observe.stats``) and the statements of ``sqla_jobs.sql``: no SQL of the dashboard's
own. Every read is a plain SELECT that locks nothing, so a dashboard left open never gets in a
worker's way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from sqla_jobs.jobs import Jobs
from sqla_jobs.kinds import check_name
from sqla_jobs.model import STATES
from sqla_jobs.observe.limiters import Limiter
from sqla_jobs.observe.limiters import limiters as read_limiters
from sqla_jobs.observe.stale import StaleHolder, stale_holders
from sqla_jobs.observe.stats import by_state, queue_overview
from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import listings as listings_sql
from sqla_jobs.sql import stats as stats_sql
from sqla_jobs.sql import workers as workers_sql

#: Jobs on one page of a listing.
PAGE_SIZE = 50
#: Rate limiters listed on the queues page (a ``by=`` key per customer makes many).
LIMITERS_SHOWN = 50
MAX_ID = 2**63 - 1


class BadRequest(ValueError):
    """A filter or id in the URL that cannot be one; the message says what is allowed."""


def job_id(value: object) -> int:
    """A job id from a URL or a form: a whole number from 1 (else :class:`BadRequest`)."""
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_ID:
        raise BadRequest(f"invalid job id {str(value)[:40]!r}: ids are whole numbers from 1")
    return number


def name(what: str, value: str | None) -> str | None:
    """A queue or kind name from a URL or a form, or None (else :class:`BadRequest`)."""
    if value is None or value == "":
        return None
    try:
        return check_name(what, value)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


@dataclass(frozen=True)
class JobFilter:
    """The filters of the jobs listing, and where its page starts (below id ``before``)."""

    state: str | None = None
    queue: str | None = None
    kind: str | None = None
    before: int | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> JobFilter:
        state = params.get("state") or None
        if state is not None and state not in STATES:
            raise BadRequest(f"invalid state {state[:40]!r}: use {', '.join(STATES)}")
        before = params.get("before") or None
        return cls(
            state=state,
            queue=name("queue", params.get("queue")),
            kind=name("kind", params.get("kind")),
            before=None if before is None else job_id(before),
        )


def _options(jobs: Jobs) -> dict[str, Any]:
    return {} if jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}


def job_page(session: Session, jobs: Jobs, where: JobFilter) -> tuple[list[Row[Any]], int | None]:
    """One page of jobs, newest first, and the ``before`` of the next page (None: last page)."""
    rows = list(
        session.execute(
            listings_sql.list_jobs_page(),
            {
                "states": None if where.state is None else [where.state],
                "queue": where.queue,
                "kind": where.kind,
                "meta": None,
                "before": MAX_ID if where.before is None else where.before,
                # One more than a page: whether there is a next one, without counting.
                "limit": PAGE_SIZE + 1,
            },
            execution_options=_options(jobs),
        )
    )
    if len(rows) > PAGE_SIZE:
        return rows[:PAGE_SIZE], int(rows[PAGE_SIZE - 1].id)
    return rows, None


def stale(session: Session, jobs: Jobs, rows: list[Row[Any]]) -> dict[int, StaleHolder]:
    """Which of the running jobs in ``rows`` run on a stale worker (it missed two heartbeats)."""
    return stale_holders(session, jobs, [int(r.id) for r in rows if r.state == "running"])


def queues(session: Session, jobs: Jobs) -> dict[str, dict[str, Any]]:
    """Per queue: jobs by state, the oldest due job's age, and since when it is paused."""
    return queue_overview(session, jobs)


def kinds(session: Session, jobs: Jobs) -> dict[str, dict[str, Any]]:
    """Per kind: jobs by state and the oldest due job's age."""
    rows = [
        (r.kind, r.state, int(r.jobs), r.oldest_due)
        for r in session.execute(stats_sql.stats_by_kind(), execution_options=_options(jobs))
    ]
    return dict(sorted(by_state(rows).items()))


def workers(session: Session, jobs: Jobs) -> list[Row[Any]]:
    """The registered workers, oldest first, with their heartbeat's age."""
    return list(session.execute(workers_sql.list_workers(), execution_options=_options(jobs)))


def database_now(session: Session) -> Any:
    """The database's clock: the pages never take time from the machine they run on."""
    return session.execute(catalog_sql.database_clock()).scalar_one()


def limiters(session: Session, jobs: Jobs) -> list[Limiter]:
    """The rate limiters, by key: limit, starts in the window now, next allowed start."""
    return read_limiters(session, jobs.schema)
