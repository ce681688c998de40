"""What ``sqla-jobs jobs list``, ``jobs show`` and ``queues`` read and how they print it: a table
for people, JSON (one object per line) for programs. Payloads only on request (``jobs show
--payload``): they may hold personal data, and a listing is often pasted into a ticket. A running
job whose worker is stale (:mod:`sqla_jobs.observe.stale`) is marked, in JSON as ``stale_worker``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from sqla_jobs.cli.common import EXIT_NOT_APPLICABLE, CLIError, checked_name
from sqla_jobs.cli.graph import relatives_json, relatives_lines
from sqla_jobs.cli.links import Linked, bad_value
from sqla_jobs.cli.links import statement as linked_statement
from sqla_jobs.jobs import Jobs
from sqla_jobs.model import STATES, Job, JobState
from sqla_jobs.observe.stale import StaleHolder, stale_holders
from sqla_jobs.observe.stats import _age
from sqla_jobs.operations.relatives import Relatives
from sqla_jobs.sql import listings as listings_sql

MAX_LIMIT = 10_000
#: Characters of ``last_error`` in a table row; ``jobs show`` has it whole.
ERROR_WIDTH = 60


@dataclass(frozen=True)
class JobQuery:
    """The filters of ``jobs list``, checked."""

    states: list[str] | None
    queue: str | None
    kind: str | None
    meta: dict[str, Any] | None
    limit: int
    #: Only the jobs linked to one row of the application's (``--linked``).
    linked: Linked | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JobQuery:
        states = None
        if args.state:
            states = [s.strip() for value in args.state for s in value.split(",") if s.strip()]
            unknown = [s for s in states if s not in STATES]
            if unknown or not states:
                raise CLIError(
                    f"invalid state {', '.join(map(repr, unknown or args.state))}: "
                    f"use {', '.join(STATES)}"
                )
        try:
            limit = int(args.limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            raise CLIError(
                f"invalid --limit {args.limit!r}: use a whole number from 1 to {MAX_LIMIT}"
            )
        return cls(
            states=states,
            queue=checked_name("queue", args.queue),
            kind=checked_name("kind", args.kind),
            meta=_meta(args.meta) if args.meta else None,
            limit=limit,
            linked=Linked.parse(args.linked) if getattr(args, "linked", None) else None,
        )


def _meta(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` (a string) and ``KEY:=JSON`` (any JSON value) as one jsonb containment."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or key == ":":
            raise CLIError(f"invalid --meta {pair!r}: use KEY=VALUE or KEY:=JSON")
        if key.endswith(":"):
            key = key[:-1]
            try:
                out[key] = json.loads(value)
            except ValueError:
                raise CLIError(
                    f"invalid --meta {pair!r}: the value after := must be JSON (use KEY=VALUE "
                    "for a string)"
                ) from None
        else:
            out[key] = value
    return out


def _options(jobs: Jobs) -> dict[str, Any]:
    return {} if jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}


def list_jobs(session: Session, jobs: Jobs, query: JobQuery) -> list[Row[Any]]:
    """The jobs matching ``query``, newest first (no payloads)."""
    params = {
        "states": query.states,
        "queue": query.queue,
        "kind": query.kind,
        "meta": query.meta,
        "limit": query.limit,
    }
    if query.linked is None:
        return list(
            session.execute(listings_sql.list_jobs(), params, execution_options=_options(jobs))
        )
    stmt = linked_statement(session, jobs.schema, query.linked)
    try:
        found = session.execute(
            stmt, {**params, "linked": query.linked.value}, execution_options=_options(jobs)
        )
    except DataError as exc:
        # The server could not cast the value to the column's type: a usage error.
        raise bad_value(query.linked, exc) from None
    return list(found)


def stale_of(
    session: Session, jobs: Jobs, rows: Sequence[Row[Any] | Job]
) -> dict[int, StaleHolder]:
    """Which of the running jobs in ``rows`` (listed, or :class:`Job` objects) run on a stale
    worker."""
    running = JobState.RUNNING.value
    return stale_holders(session, jobs, [int(r.id) for r in rows if r.state == running])


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _job_json(row: Any, columns: list[str]) -> dict[str, Any]:
    return {
        c: _time(v) if isinstance(v, datetime) else v for c, v in zip(columns, row, strict=True)
    }


def render_jobs(
    rows: list[Row[Any]], *, as_json: bool, stale: Mapping[int, StaleHolder] | None = None
) -> str:
    """Rows of :func:`list_jobs` as a table, or as JSON lines; the jobs in ``stale`` marked."""
    stale = stale or {}
    if as_json:
        return "\n".join(
            json.dumps(
                _job_json(r, list(r._fields)) | {"stale_worker": _stale_json(stale.get(int(r.id)))}
            )
            for r in rows
        )
    if not rows:
        return "(no jobs)"
    lines = [
        f"{'id':>8}  {'queue':<14} {'kind':<20} {'state':<9} {'attempts':>8}  "
        f"{'run_at':<19}  last_error"
    ]
    for r in rows:
        error = (r.last_error or "").replace("\n", " ")
        if len(error) > ERROR_WIDTH:
            error = error[: ERROR_WIDTH - 3] + "..."
        if (holder := stale.get(int(r.id))) is not None:
            error = f"! {holder.note()}  {error}"
        lines.append(
            f"{r.id:>8}  {r.queue:<14} {r.kind:<20} {r.state:<9} "
            f"{f'{r.attempts}/{r.max_attempts}':>8}  {_clock(r.run_at):<19}  {error}".rstrip()
        )
    return "\n".join(lines)


def _stale_json(holder: StaleHolder | None) -> dict[str, Any] | None:
    return None if holder is None else holder.as_json()


def _clock(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def not_found(job_id: int) -> CLIError:
    """The error of ``jobs show`` for an id no row has."""
    return CLIError(
        f"no job with id {job_id} (a completed job is deleted unless its row had to be kept)",
        EXIT_NOT_APPLICABLE,
    )


_SHOWN = [
    *("id", "queue", "kind", "state", "priority", "attempts", "max_attempts", "crashes"),
    *("max_crashes", "interruptions", "run_at", "created_at", "finished_at"),
    *("cancel_requested_at", "locked_by", "lease_expires_at", "concurrency_key"),
    *("concurrency_limit", "waiting_on", "last_error", "meta", "steps", "errors"),
]


def render_job(
    job: Job,
    *,
    as_json: bool,
    payload: bool,
    traces: bool,
    stale: StaleHolder | None = None,
    relatives: Relatives | None = None,
) -> str:
    """One job for ``jobs show``: every field but the payload (unless ``payload``); the errors'
    tracebacks always in JSON, in text only with ``traces``; ``stale``: its worker is stale;
    ``relatives``: its parents and children."""
    data = {name: getattr(job, name) for name in _SHOWN}
    data["stale_worker"] = _stale_json(stale)
    if relatives is not None:
        data |= relatives_json(relatives)
    if payload:
        data["payload"] = job.payload
    if as_json:
        return json.dumps(
            {k: _time(v) if isinstance(v, datetime) else v for k, v in data.items()}, default=str
        )
    lines = [
        f"job {job.id}: {job.kind} in queue {job.queue}, {job.state}",
        f"  attempts       {job.attempts} of {job.max_attempts} (crashes {job.crashes} of "
        f"{job.max_crashes}, interruptions {job.interruptions})",
        f"  priority       {job.priority}",
        f"  run_at         {_clock(job.run_at)}",
        f"  created_at     {_clock(job.created_at)}",
        f"  finished_at    {_clock(job.finished_at)}",
    ]
    if job.cancel_requested_at is not None:
        lines.append(f"  cancel asked   {_clock(job.cancel_requested_at)}")
    if job.locked_by is not None:
        lines.append(f"  locked_by      {job.locked_by} (lease to {_clock(job.lease_expires_at)})")
    if stale is not None:
        lines.append(f"  worker         ! {stale.note()}")
    if job.concurrency_key is not None:
        lines.append(f"  concurrency    {job.concurrency_key} (limit {job.concurrency_limit})")
    if relatives is not None:
        lines.extend(relatives_lines(relatives, job.waiting_on))
    lines.append(f"  last_error     {job.last_error or '-'}")
    lines.append(f"  meta           {json.dumps(job.meta) if job.meta else '-'}")
    lines.append(f"  steps          {', '.join(job.steps) if job.steps else '-'}")
    if payload:
        lines.append(f"  payload        {json.dumps(job.payload)}")
    errors = job.errors or []
    lines.append(f"  errors         {len(errors) or '-'}")
    for entry in errors:
        lines.append(
            f"    attempt {entry.get('attempt')} at {entry.get('at')}: "
            f"{entry.get('error')}: {entry.get('message')}"
        )
        if traces and entry.get("traceback"):
            lines.extend(f"      {t}" for t in str(entry["traceback"]).rstrip().splitlines())
    return "\n".join(lines)


def render_queues(queues: dict[str, dict[str, Any]], *, as_json: bool) -> str:
    """:func:`~sqla_jobs.observe.stats.queue_overview` as a table, or as JSON lines."""
    if as_json:
        return "\n".join(
            json.dumps(
                {"queue": name}
                | {s: q[s] for s in STATES}
                | {
                    "oldest_due_seconds": _seconds(q["oldest_due"]),
                    "workers": q.get("workers", 0),
                    "slots": q.get("slots", 0),
                    "paused": q.get("paused_at") is not None,
                    "paused_at": _time(q.get("paused_at")),
                }
            )
            for name, q in queues.items()
        )
    if not queues:
        return "(no queues)"
    header = (
        f"{'queue':<20} "
        + " ".join(f"{s:>9}" for s in STATES)
        + f" {'workers':>7} {'oldest due':>11}  paused"
    )
    lines = [header]
    for name, q in queues.items():
        paused = q.get("paused_at")
        lines.append(
            f"{name:<20} "
            + " ".join(f"{q[s]:>9}" for s in STATES)
            + f" {q.get('workers', 0):>7} {_age(q['oldest_due']):>11}  "
            + ("-" if paused is None else f"since {_clock(paused)}")
        )
    return "\n".join(lines)


def _seconds(age: timedelta | None) -> float | None:
    return None if age is None else round(age.total_seconds(), 3)
