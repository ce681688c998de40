"""What an operator does to schedules: list them, pause and resume one, run one now; each in the
caller's transaction, as the job operations are (:mod:`sqla_jobs.operations.jobs`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from sqla_jobs.errors import ScheduleNotFoundError
from sqla_jobs.model import Job
from sqla_jobs.periodic.schedule import Periodic
from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import schedules as schedules_sql


class Host(Protocol):
    """What periodic jobs need of the :class:`~sqla_jobs.Jobs` that declares them (a ``Jobs`` is
    one): its schedules, its schema and channel, and its enqueue. Typed here so that nothing under
    the facade imports it."""

    schema: str | None
    channel: str

    @property
    def schedules(self) -> list[Periodic]: ...

    def schedule_named(self, name: str) -> Periodic | None: ...

    @property
    def enqueue(self) -> Callable[..., Job]: ...


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule as ``sqla-jobs schedules`` shows it: declared in the code (``definition``),
    recorded in ``sqla_jobs_schedule`` (the other fields; None before a scheduler first ran it),
    or both. ``next_tick_at`` is the next tick a scheduler will enqueue (None while paused, or
    for a schedule no longer in the code, which nothing enqueues); ``next_tick_if_resumed_at``
    is, for a paused schedule still in the code, the tick a resume now would lead to.
    ``last_job_state`` is None once the last job's row has left the job table: see
    ``last_job_gone``."""

    name: str
    kind: str
    spec: str
    definition: Periodic | None
    last_tick_at: datetime | None = None
    last_job_id: int | None = None
    last_job_state: str | None = None
    next_tick_at: datetime | None = None
    paused_at: datetime | None = None
    seen_at: datetime | None = None
    next_tick_if_resumed_at: datetime | None = None

    @property
    def in_code(self) -> bool:
        return self.definition is not None

    @property
    def last_job_gone(self) -> bool:
        """Whether the last job's row has left the job table. The row alone cannot say why: the
        job completed (deleted, or moved to history), or it ended and was pruned or deleted."""
        return self.last_job_id is not None and self.last_job_state is None


def _options(jobs: Host) -> dict[str, Any]:
    return {} if jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}


def _declared(jobs: Host, name: str) -> Periodic:
    schedule = jobs.schedule_named(name)
    if schedule is None:
        known = ", ".join(s.name for s in jobs.schedules) or "none"
        raise ScheduleNotFoundError(
            f"no schedule named {name!r} is declared in this application (declared: {known})"
        )
    return schedule


def listing(session: Session, jobs: Host) -> list[ScheduleInfo]:
    """Every schedule declared or recorded, by name."""
    conn = session.connection()
    options = _options(jobs)
    rows = {
        r.name: r for r in conn.execute(schedules_sql.list_schedules(), execution_options=options)
    }
    now: datetime = conn.execute(catalog_sql.database_clock()).scalar_one()
    infos = []
    for name in sorted(set(rows) | {s.name for s in jobs.schedules}):
        row = rows.get(name)
        definition = jobs.schedule_named(name)
        next_tick = if_resumed = None
        if definition is not None:
            # A resume moves the last tick up to now (set_schedule_paused), so both are the
            # first tick after the later of the two.
            last = row.last_tick_at if row is not None else None
            upcoming = definition.next_after(max(last, now) if last is not None else now)
            if row is not None and row.paused_at is not None:
                if_resumed = upcoming
            else:
                next_tick = upcoming
        if definition is not None:
            kind, spec = definition.kind.name, definition.spec
        else:
            assert row is not None
            kind, spec = row.kind, row.spec
        infos.append(
            ScheduleInfo(
                name=name,
                kind=kind,
                spec=spec,
                definition=definition,
                last_tick_at=row.last_tick_at if row is not None else None,
                last_job_id=row.last_job_id if row is not None else None,
                last_job_state=row.last_job_state if row is not None else None,
                next_tick_at=next_tick,
                paused_at=row.paused_at if row is not None else None,
                seen_at=row.seen_at if row is not None else None,
                next_tick_if_resumed_at=if_resumed,
            )
        )
    return infos


def set_paused(session: Session, jobs: Host, name: str, paused: bool) -> datetime | None:
    """Pause or resume schedule ``name``; returns when it was paused (None: resumed)."""
    schedule = _declared(jobs, name)
    row = (
        session.connection()
        .execute(
            schedules_sql.set_schedule_paused(),
            {
                "schedule_name": schedule.name,
                "schedule_kind": schedule.kind.name,
                "schedule_spec": schedule.spec,
                "paused": paused,
            },
            execution_options=_options(jobs),
        )
        .one()
    )
    paused_at: datetime | None = row.paused_at
    return paused_at


def run_now(session: Session, jobs: Host, name: str) -> Job:
    """Enqueue one job of schedule ``name`` to run now, outside its ticks: the schedule's last
    tick is not touched, so its next tick still comes."""
    schedule = _declared(jobs, name)
    tick: datetime = session.execute(catalog_sql.database_clock()).scalar_one()
    return jobs.enqueue(
        session,
        schedule.build_payload(tick),
        queue=schedule.queue,
        priority=schedule.priority,
        meta={"schedule": schedule.name, "tick": tick.isoformat(), "manual": True},
    )
