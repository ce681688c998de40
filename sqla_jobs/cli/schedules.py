"""``sqla-jobs schedules``: list an application's periodic schedules, run one now, pause or
resume one (the operations of :mod:`sqla_jobs.periodic.ops`).

The application is loaded (``MODULE:ATTR``, as for ``sqla-jobs worker``) because the schedules
are defined in its code; the database holds only their state. A schedule recorded in the database
but no longer in the code is listed as such: nothing enqueues it any more.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs.cli.common import (
    EXIT_OK,
    add_database_options,
    check_reachable,
    database_url,
    load_jobs,
)
from sqla_jobs.db.preflight import check_job_table
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.jobs import Jobs
from sqla_jobs.periodic.ops import ScheduleInfo

Command = Callable[[argparse.Namespace], int]


@contextmanager
def _session(args: argparse.Namespace) -> Iterator[tuple[Jobs, Session]]:
    jobs = load_jobs(args.target)
    url = database_url(args)
    check_reachable(url)
    check_job_table(
        url, jobs.schema, lambda schema: f"set Jobs(schema={schema!r}) in {args.target}"
    )
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with Session(engine) as session, session.begin():
            yield jobs, session
    finally:
        engine.dispose()


def _time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _next(info: ScheduleInfo) -> str:
    if not info.in_code:
        return "not in code"
    if info.paused_at is not None:
        # Not a bare time in this column: it would read as "runs at".
        resumed = _time(info.next_tick_if_resumed_at)
        return f"paused since {_time(info.paused_at)} (if resumed now, next tick {resumed})"
    return _time(info.next_tick_at)


def _last_job(info: ScheduleInfo) -> str:
    if info.last_job_id is None:
        return "-"
    if info.last_job_gone:
        # The schedule's row keeps only the id: no more is known of a job whose row is gone.
        return f"{info.last_job_id} gone (completed, pruned or deleted)"
    return f"{info.last_job_id} {info.last_job_state}"


def render(infos: list[ScheduleInfo], *, as_json: bool) -> str:
    """The schedules as a table (times in UTC), or as JSON lines."""
    if as_json:
        return "\n".join(json.dumps(_json(i)) for i in infos)
    if not infos:
        return "(no schedules: declare one with @jobs.periodic)"
    rows = [("name", "kind", "schedule", "next tick (UTC)", "last tick (UTC)", "last job")]
    rows += [(i.name, i.kind, i.spec, _next(i), _time(i.last_tick_at), _last_job(i)) for i in infos]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    )


def _json(info: ScheduleInfo) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "name": info.name,
        "kind": info.kind,
        "schedule": info.spec,
        "in_code": info.in_code,
        "paused_at": iso(info.paused_at),
        "next_tick_at": iso(info.next_tick_at),
        "last_tick_at": iso(info.last_tick_at),
        "last_job_id": info.last_job_id,
        "last_job_state": info.last_job_state,
        "seen_at": iso(info.seen_at),
        "last_job_gone": info.last_job_gone,
        "next_tick_if_resumed_at": iso(info.next_tick_if_resumed_at),
    }


def cmd_list(args: argparse.Namespace) -> int:
    with _session(args) as (jobs, session):
        infos = jobs.list_schedules(session)
    text = render(infos, as_json=getattr(args, "json", False))
    if text:  # JSON lines of no schedules are no lines, not one empty line
        print(text)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    with _session(args) as (jobs, session):
        job = jobs.run_schedule(session, args.name)
        job_id = job.id
    print(f"enqueued job {job_id} of schedule {args.name} to run now (its ticks are unchanged)")
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    with _session(args) as (jobs, session):
        jobs.pause_schedule(session, args.name)
    print(f"paused schedule {args.name}: no tick is enqueued until it is resumed")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    with _session(args) as (jobs, session):
        jobs.resume_schedule(session, args.name)
    print(f"resumed schedule {args.name}: it ticks again from its next tick (missed ones skipped)")
    return EXIT_OK


def register(sub: Any, epilog: str) -> None:
    """Add ``schedules`` to the ``sqla-jobs`` sub-commands ``sub``."""
    s = sub.add_parser(
        "schedules",
        help="list the periodic schedules of an application; run, pause or resume one",
        epilog=epilog,
    )
    ss = s.add_subparsers(dest="schedules_command", required=True, metavar="COMMAND")
    ls = ss.add_parser("list", help="each schedule, its next and last tick", epilog=epilog)
    ls.add_argument("target", metavar="APP", help="MODULE:ATTR of your Jobs, e.g. myapp.tasks:jobs")
    ls.add_argument("--json", action="store_true", help="one JSON object per schedule")
    add_database_options(ls, schema=False)
    ls.set_defaults(func=cmd_list)
    for name, func, help in (
        ("run", cmd_run, "enqueue one job of the schedule now, its ticks unchanged"),
        ("pause", cmd_pause, "enqueue none of its ticks until it is resumed"),
        ("resume", cmd_resume, "tick again, from the next tick after now"),
    ):
        p = ss.add_parser(name, help=help, epilog=epilog)
        p.add_argument(
            "target", metavar="APP", help="MODULE:ATTR of your Jobs, e.g. myapp.tasks:jobs"
        )
        p.add_argument("name", metavar="NAME", help="the schedule's name (default: its kind's)")
        add_database_options(p, schema=False)
        p.set_defaults(func=func)
