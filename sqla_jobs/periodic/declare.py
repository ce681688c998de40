"""``Jobs.periodic``: declare the schedules a worker's scheduler enqueues (the definitions live in
code; their state, the last tick enqueued, in ``sqla_jobs_schedule``)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session, scoped_session

from sqla_jobs.db.sessions import current
from sqla_jobs.errors import RegistryError
from sqla_jobs.kinds import Kind, Registry, check_name, validate_options
from sqla_jobs.model import Job
from sqla_jobs.periodic import ops as _schedule_ops
from sqla_jobs.periodic.ops import Host, ScheduleInfo
from sqla_jobs.periodic.schedule import MAX_BACKFILL, UTC, Missed, PayloadArg, Periodic

__all__ = ["Periodics"]

#: The decorated handler (what ``@jobs.kind`` returned), returned with its type unchanged.
_F = TypeVar("_F", bound=Callable[..., object])
#: Any instant: cronsim parses the expression when it is built.
_PARSE_AT = datetime(2000, 1, 1, tzinfo=UTC)


class Periodics(Registry):
    """The schedules half of :class:`~sqla_jobs.Jobs`."""

    def __init__(self) -> None:
        super().__init__()
        self._schedules: dict[str, Periodic] = {}

    @property
    def schedules(self) -> list[Periodic]:
        """The schedules declared, by name."""
        return [self._schedules[name] for name in sorted(self._schedules)]

    def schedule_named(self, name: str) -> Periodic | None:
        """The schedule declared as ``name``, or None."""
        return self._schedules.get(name)

    # -- operations, in the caller's transaction (see sqla_jobs.periodic.ops) -----------------

    def list_schedules(self, session: Session | scoped_session[Any]) -> list[ScheduleInfo]:
        """Every schedule declared here or recorded in the database, by name, with its last
        tick, its last job's state and its next tick."""
        return _schedule_ops.listing(current(session), self._as_jobs())

    def pause_schedule(self, session: Session | scoped_session[Any], name: str) -> datetime:
        """Hold schedule ``name``: no tick is enqueued until it is resumed (a tick already
        enqueued ahead, at most a couple of seconds before its time, still runs). Returns when
        it was paused (a second pause keeps the first time). Takes effect at commit."""
        paused_at = _schedule_ops.set_paused(current(session), self._as_jobs(), name, True)
        assert paused_at is not None
        return paused_at

    def resume_schedule(self, session: Session | scoped_session[Any], name: str) -> None:
        """Let schedule ``name`` tick again from its next tick after now: the ticks that passed
        while it was paused are skipped, whatever its ``missed`` policy."""
        _schedule_ops.set_paused(current(session), self._as_jobs(), name, False)

    def run_schedule(self, session: Session | scoped_session[Any], name: str) -> Job:
        """Enqueue a job of schedule ``name`` now (its payload built for the current time), as
        one more run: the schedule's own ticks are unchanged."""
        return _schedule_ops.run_now(current(session), self._as_jobs(), name)

    def _as_jobs(self) -> Host:
        return typing.cast("Host", self)

    # -- declaration ---------------------------------------------------------------------------

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: timedelta | None = None,
        timezone: str = "UTC",
        name: str | None = None,
        payload: PayloadArg = None,
        missed: Missed = "skip",
        grace: timedelta = timedelta(minutes=1),
        queue: str | None = None,
        priority: int | None = None,
    ) -> Callable[[_F], _F]:
        """Decorator, above ``@jobs.kind``: enqueue a job of that kind at each tick of ``cron``
        (five fields, or six with seconds first; in ``timezone``) or of ``every`` (whole
        seconds, ticking at multiples of it since the epoch, UTC).

        ``payload`` is a model instance, or a function of the tick (a UTC datetime) returning
        one; by default the kind's model built with no arguments. ``name`` (default: the kind's
        name) identifies the schedule's state in the database: give one to run a kind on two
        schedules. ``missed`` says what to do with ticks that passed while no scheduler ran (more
        than ``grace`` ago): ``"skip"`` them (default), run the latest ``"once"``, or run up to
        the N latest. ``queue`` and ``priority`` override the kind's. Every worker runs the
        scheduler (``Worker(schedules=False)`` or ``--no-schedules`` opts out) and each tick is
        enqueued once across all of them.
        """

        def decorate(handler: _F) -> _F:
            kind = next((k for k in self if k.handler is handler), None)
            if kind is None:
                raise RegistryError(
                    f"@jobs.periodic on {getattr(handler, '__qualname__', handler)!r}: it is not a "
                    "registered handler; put @jobs.periodic above @jobs.kind"
                )
            self.add_periodic(
                kind.name,
                cron,
                every=every,
                timezone=timezone,
                name=name,
                payload=payload,
                missed=missed,
                grace=grace,
                queue=queue,
                priority=priority,
            )
            return handler

        return decorate

    def add_periodic(
        self,
        kind: str,
        cron: str | None = None,
        *,
        every: timedelta | None = None,
        timezone: str = "UTC",
        name: str | None = None,
        payload: PayloadArg = None,
        missed: Missed = "skip",
        grace: timedelta = timedelta(minutes=1),
        queue: str | None = None,
        priority: int | None = None,
    ) -> Periodic:
        """:meth:`periodic` without a decorator, for a kind registered by name (its handler may
        live in another process); returns the schedule."""
        registered = self.kind_named(kind)
        if registered is None:
            raise RegistryError(f"schedule of kind {kind!r}: no such kind is registered")
        schedule = Periodic(
            name=_name(name or kind),
            kind=registered,
            cron=_cron(cron, every),
            every=_every(every),
            timezone=_zone(timezone),
            payload=_payload(registered, payload),
            missed=_missed(missed),
            grace=_grace(grace),
            queue=queue,
            priority=priority,
        )
        _options(registered, queue, priority)
        if schedule.name in self._schedules:
            raise RegistryError(
                f"a schedule named {schedule.name!r} is already declared: pass name= to tell "
                "two schedules of one kind apart"
            )
        self._schedules[schedule.name] = schedule
        return schedule


def _name(name: str) -> str:
    try:
        check_name("schedule", name)
    except ValueError as exc:
        raise RegistryError(str(exc)) from None
    return name


def _cron(cron: str | None, every: timedelta | None) -> str | None:
    if (cron is None) == (every is None):
        raise RegistryError("a schedule needs exactly one of a cron expression and every=")
    if cron is not None:
        try:
            CronSim(cron, _PARSE_AT)
        except (CronSimError, ValueError) as exc:
            raise RegistryError(f"cron expression {cron!r}: {exc}") from None
    return cron


def _every(every: timedelta | None) -> timedelta | None:
    if every is None:
        return None
    if not isinstance(every, timedelta) or every < timedelta(seconds=1) or every.microseconds:
        raise RegistryError(f"every= must be a timedelta of whole seconds >= 1s, got {every!r}")
    return every


def _zone(timezone: str) -> str:
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise RegistryError(
            f"timezone {timezone!r} is not an IANA time zone (e.g. 'Europe/Paris', 'UTC')"
        ) from None
    return timezone


def _payload(kind: Kind, payload: PayloadArg) -> PayloadArg:
    if payload is None:
        try:
            kind.model()
        except ValidationError as exc:
            fields = ", ".join(str(e["loc"][0]) for e in exc.errors() if e["loc"])
            raise RegistryError(
                f"schedule of kind {kind.name!r}: its model needs fields ({fields}): pass "
                "payload= (an instance, or a function of the tick returning one)"
            ) from None
    elif isinstance(payload, BaseModel):
        if type(payload) is not kind.model:
            raise RegistryError(
                f"schedule of kind {kind.name!r}: payload is a {type(payload).__qualname__}, "
                f"not a {kind.model.__qualname__}"
            )
    elif not callable(payload):
        raise RegistryError(
            "payload= must be a model instance or a function of the tick returning one"
        )
    return payload


def _missed(missed: Missed) -> Missed:
    if missed in get_args(get_args(Missed)[0]):
        return missed
    if isinstance(missed, int) and not isinstance(missed, bool) and 1 <= missed <= MAX_BACKFILL:
        return missed
    raise RegistryError(
        f"missed= must be 'skip', 'once' or a number of ticks from 1 to {MAX_BACKFILL}, "
        f"got {missed!r}"
    )


def _grace(grace: timedelta) -> timedelta:
    if not isinstance(grace, timedelta) or grace <= timedelta(0):
        raise RegistryError(f"grace= must be a positive timedelta, got {grace!r}")
    return grace


def _options(kind: Kind, queue: str | None, priority: int | None) -> None:
    options = kind.options
    options = options if queue is None else dataclasses.replace(options, queue=queue)
    options = options if priority is None else dataclasses.replace(options, priority=priority)
    try:
        validate_options(options)
    except RegistryError as exc:
        raise RegistryError(f"schedule of kind {kind.name!r}: {exc}") from None
