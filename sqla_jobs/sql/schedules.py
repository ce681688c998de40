"""Periodic schedules (:mod:`sqla_jobs.periodic`, ``sqla-jobs schedules``): the scheduler's
registration, its read and compare-and-set of each tick, and the operator's pause and listing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Select,
    Text,
    bindparam,
    case,
    func,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from sqla_jobs.sql.tables import (
    job,
    schedule,
)

if TYPE_CHECKING:
    from sqla_jobs.sql.tables import AnyInsert, AnyUpdate


__all__ = [
    "advance_schedule",
    "limit_idle_in_transaction",
    "list_schedules",
    "read_schedules",
    "record_schedule_job",
    "register_schedules",
    "set_schedule_paused",
]


def register_schedules() -> AnyInsert:
    """Add the rows of schedules not yet in ``sqla_jobs_schedule``: ``names``, ``kinds`` and
    ``specs`` are parallel text arrays. Rows already there are left alone (``ON CONFLICT DO
    NOTHING``: no lock on them, so a scheduler starting never waits behind a tick's
    transaction). Returns the names inserted."""
    rows = select(
        func.unnest(bindparam("names", type_=ARRAY(Text))).label("name"),
        func.unnest(bindparam("kinds", type_=ARRAY(Text))).label("kind"),
        func.unnest(bindparam("specs", type_=ARRAY(Text))).label("spec"),
    )
    return (
        pg_insert(schedule)
        .from_select(["name", "kind", "spec"], rows)
        .on_conflict_do_nothing(index_elements=[schedule.c.name])
        .returning(schedule.c.name)
    )


def read_schedules() -> Select[Any]:
    """The scheduling state of the schedules named in ``names`` (a text array): ``spec``,
    ``last_tick_at``, ``paused_at``, and the database clock (``clock_timestamp()``, the time
    every tick is planned by). No locks; primary key probes."""
    return select(
        schedule.c.name,
        schedule.c.spec,
        schedule.c.last_tick_at,
        schedule.c.paused_at,
        func.clock_timestamp().label("now"),
    ).where(schedule.c.name == func.any(bindparam("names", type_=ARRAY(Text))))


def advance_schedule() -> AnyUpdate:
    """Compare-and-set: move schedule ``schedule_name`` from last tick ``prev`` (NULL: none yet) to
    ``tick``, writing ``next_tick``, ``schedule_spec`` and ``schedule_kind``, unless it is paused. The row is locked
    ``FOR UPDATE SKIP LOCKED``: a scheduler never waits for another one's tick, and of two that
    race for the same ``prev`` only one gets the row back (the other's re-check, under READ
    COMMITTED, sees the new ``last_tick_at``). Returns the name when it advanced, nothing
    otherwise. Run in the transaction that enqueues the tick's jobs, so the two commit together."""
    prev = bindparam("prev", type_=schedule.c.last_tick_at.type)
    name = bindparam("schedule_name", type_=Text)
    locked = (
        select(schedule.c.name)
        .where(
            schedule.c.name == name,
            schedule.c.last_tick_at.is_not_distinct_from(prev),
            schedule.c.paused_at.is_(None),
        )
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        update(schedule)
        .where(schedule.c.name == locked)
        .values(
            last_tick_at=bindparam("tick", type_=schedule.c.last_tick_at.type),
            next_tick_at=bindparam("next_tick", type_=schedule.c.next_tick_at.type),
            spec=bindparam("schedule_spec", type_=Text),
            kind=bindparam("schedule_kind", type_=Text),
            seen_at=func.now(),
            updated_at=func.now(),
        )
        .returning(schedule.c.name)
    )


def record_schedule_job() -> AnyUpdate:
    """Set the last job enqueued by schedule ``schedule_name`` to ``last_job`` (in the transaction that
    advanced it, whose lock it already holds)."""
    return (
        update(schedule)
        .where(schedule.c.name == bindparam("schedule_name", type_=Text))
        .values(last_job_id=bindparam("last_job", type_=BigInteger))
        .returning(schedule.c.name)
    )


def set_schedule_paused() -> AnyInsert:
    """Pause (``paused`` true) or resume schedule ``schedule_name`` (of ``schedule_kind``, defined as ``schedule_spec``),
    adding its row if no scheduler has yet. A pause keeps its first time. A resume of a paused
    schedule moves its last tick up to now, so the ticks that passed while it was held are
    skipped, not caught up; resuming one that is not paused changes nothing. Waits for a tick's
    transaction on that row (milliseconds). Returns ``paused_at`` and ``last_tick_at``."""
    paused = bindparam("paused", type_=Boolean)
    stmt = pg_insert(schedule).values(
        name=bindparam("schedule_name", type_=Text),
        kind=bindparam("schedule_kind", type_=Text),
        spec=bindparam("schedule_spec", type_=Text),
        paused_at=case((paused, func.now()), else_=null()),
        last_tick_at=case((paused, null()), else_=func.now()),
    )
    return stmt.on_conflict_do_update(
        index_elements=[schedule.c.name],
        set_={
            "paused_at": case(
                (paused, func.coalesce(schedule.c.paused_at, func.now())), else_=null()
            ),
            "last_tick_at": case(
                (or_(paused, schedule.c.paused_at.is_(None)), schedule.c.last_tick_at),
                else_=func.greatest(schedule.c.last_tick_at, func.now()),
            ),
            "updated_at": func.now(),
        },
    ).returning(schedule.c.paused_at, schedule.c.last_tick_at)


def limit_idle_in_transaction() -> Select[tuple[object]]:
    """For the rest of the transaction, let the server end it if its client goes quiet for
    ``timeout`` (text, e.g. ``'10s'``): a scheduler frozen in a tick's transaction then lets go of
    the schedule's row lock instead of holding that schedule back until it thaws."""
    return select(
        func.set_config(
            "idle_in_transaction_session_timeout", bindparam("timeout", type_=Text), true()
        )
    )


def list_schedules() -> Select[Any]:
    """Every row of ``sqla_jobs_schedule``, by name, with the state of its last job (NULL once
    that job is pruned). No locks; for ``sqla-jobs schedules``."""
    return (
        select(
            schedule.c.name,
            schedule.c.kind,
            schedule.c.spec,
            schedule.c.last_tick_at,
            schedule.c.last_job_id,
            schedule.c.next_tick_at,
            schedule.c.paused_at,
            schedule.c.seen_at,
            job.c.state.label("last_job_state"),
        )
        .select_from(schedule.outerjoin(job, job.c.id == schedule.c.last_job_id))
        .order_by(schedule.c.name)
    )
