"""Periodic schedules: when a schedule ticks, and which ticks a scheduler enqueues.

Cron expressions are parsed and stepped by `cronsim <https://github.com/cuu508/cronsim>`_, in
the schedule's time zone, with Debian cron's rules for daylight saving time: a job at a fixed
time that falls in the hour skipped in spring runs when that hour ends, one in the hour repeated
in autumn runs once (at the first of the two); expressions whose minute or hour field is a
wildcard (``*/5 * * * *``, ``0 * * * *``) run by elapsed time, so in the repeated hour they run
twice. Intervals (``every``) tick at the multiples of their length since the Unix epoch, in UTC:
``every=timedelta(hours=1)`` ticks on the hour whatever the process's start time.

This module does no I/O: :meth:`Periodic.plan` is pure, the scheduler
(:mod:`~sqla_jobs.periodic.scheduler`) runs it against the database clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Literal, TypeAlias
from zoneinfo import ZoneInfo

from cronsim import CronSim
from pydantic import BaseModel

from sqla_jobs.kinds import Kind

__all__ = ["COUNT_LIMIT", "MAX_BACKFILL", "Missed", "Periodic", "Plan"]

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

#: What a scheduler does with ticks that passed while no scheduler ran: ``"skip"`` them,
#: run the latest ``"once"``, or an int N: run up to the N latest.
Missed: TypeAlias = Literal["skip", "once"] | int
#: The largest N of ``missed=N``.
MAX_BACKFILL = 1000
#: Missed cron ticks are counted up to this many (about 0.6 s of CPU; a minutely schedule
#: passes it after 70 days down).
COUNT_LIMIT = 100_000

#: A payload: one fixed instance, or a function of the tick (a UTC datetime) building one.
PayloadArg: TypeAlias = BaseModel | Callable[[datetime], BaseModel] | None


@dataclass(frozen=True)
class Plan:
    """What a scheduler does with one schedule now.

    ``ticks``: the ticks to enqueue, oldest first. ``advance_to``: the tick to move the
    schedule's last tick to (the last one considered, enqueued or skipped), None when no tick is
    due. ``skipped``: missed ticks left out by the policy (of a cron schedule, counted up to
    :data:`COUNT_LIMIT`). ``next``: the first tick after
    ``advance_to`` (or after the last tick when nothing is due).
    """

    ticks: list[datetime]
    advance_to: datetime | None
    skipped: int
    next: datetime


@dataclass(frozen=True)
class Periodic:
    """One schedule: enqueue a job of ``kind`` at each tick of ``cron`` (in ``timezone``) or of
    ``every``. Built by :meth:`Jobs.periodic <sqla_jobs.Jobs.periodic>`, which checks it.

    A tick is *missed* when the scheduler finds it later than ``grace`` after its time (or
    after the next tick came, for schedules tighter than ``grace``); ``missed`` says what
    happens to missed ticks. A tick found within its grace is enqueued late, with its own time.
    """

    name: str
    kind: Kind
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    payload: PayloadArg = None
    missed: Missed = "skip"
    grace: timedelta = timedelta(minutes=1)
    queue: str | None = None
    priority: int | None = None
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_zone", ZoneInfo(self.timezone))

    @property
    def spec(self) -> str:
        """The definition's timing as stored with the schedule's state: a changed spec starts
        the schedule over from its next tick instead of catching up on the old one's."""
        if self.cron is not None:
            return f"cron {self.cron} {self.timezone}"
        assert self.every is not None
        return f"every {int(self.every.total_seconds())}s"

    def build_payload(self, tick: datetime) -> BaseModel:
        """The payload of the job for ``tick``."""
        if self.payload is None:
            return self.kind.model()
        if isinstance(self.payload, BaseModel):
            return self.payload
        return self.payload(tick)

    # -- tick arithmetic -------------------------------------------------------------------------

    def next_after(self, t: datetime) -> datetime:
        """The first tick strictly after ``t`` (aware), in UTC."""
        if self.every is not None:
            # timedelta // timedelta is integer microseconds: exact for any representable date.
            return _EPOCH + ((t - _EPOCH) // self.every + 1) * self.every
        assert self.cron is not None
        for tick in CronSim(self.cron, t.astimezone(self._zone)):
            utc = tick.astimezone(UTC)
            if utc > t:
                return utc
        raise AssertionError("unreachable: cronsim iterates forever")  # pragma: no cover

    def at_or_before(self, t: datetime) -> datetime:
        """The last tick at or before ``t`` (aware), in UTC."""
        if self.every is not None:
            return _EPOCH + ((t - _EPOCH) // self.every) * self.every
        assert self.cron is not None
        # cronsim's reverse iteration starts strictly before its (microsecond-stripped) start.
        local = (t + _US).astimezone(self._zone)
        for tick in CronSim(self.cron, local, reverse=True):
            found = tick.astimezone(UTC)
            if found <= t:
                break
        # Reverse iteration walks wall-clock time, so from the second pass of an hour repeated
        # in autumn it misses a tick of the first pass: forward iteration is the reference.
        later = self.next_after(found)
        while later <= t:
            found, later = later, self.next_after(later)
        return found

    def plan(
        self, last: datetime | None, now: datetime, *, horizon: timedelta, restart: bool = False
    ) -> Plan:
        """The ticks to enqueue at ``now`` when the last tick enqueued was ``last`` (None: the
        schedule is new and starts with its first tick after ``now``): every tick up to ``now +
        horizon`` (enqueued ahead, to run at their time), except missed ones, of which
        :attr:`missed` keeps none, the latest, or the N latest. ``restart``: the definition
        changed since ``last``, so missed ticks are skipped whatever the policy."""
        start = now if last is None else last
        first = self.next_after(start)
        if first > now + horizon:
            return Plan(ticks=[], advance_to=None, skipped=0, next=first)
        latest_past = self.at_or_before(now)
        ahead: list[datetime] = []
        if latest_past > start and now <= latest_past + self._grace_of(latest_past):
            ahead.append(latest_past)  # late, but within its grace: enqueued with its own time
        t = self.next_after(max(now, start))
        while t <= now + horizon:
            ahead.append(t)
            t = self.next_after(t)
        # The missed ticks: those in (start, latest_past], less the one found within its grace.
        late = ahead[0] if ahead and ahead[0] <= now else None
        missed = self._count(start, latest_past) - (1 if late is not None else 0)
        keep = 0 if restart else self._keep(missed)
        kept = self._latest_missed(start, latest_past, keep, late)
        advance_to = ahead[-1] if ahead else latest_past
        return Plan(
            ticks=kept + ahead,
            advance_to=advance_to,
            skipped=missed - keep,
            next=self.next_after(advance_to),
        )

    def _grace_of(self, tick: datetime) -> timedelta:
        return min(self.grace, self.next_after(tick) - tick)

    def _keep(self, missed: int) -> int:
        if self.missed == "skip":
            return 0
        if self.missed == "once":
            return min(1, missed)
        return min(int(self.missed), missed)

    def _count(self, start: datetime, end: datetime) -> int:
        """The ticks in (start, end]: exact for intervals; for cron, exact up to
        :data:`COUNT_LIMIT` and that limit past it (the count only sizes a log line)."""
        if end <= start:
            return 0
        if self.every is not None:
            return (end - _EPOCH) // self.every - (start - _EPOCH) // self.every
        assert self.cron is not None
        count = 0
        for tick in CronSim(self.cron, start.astimezone(self._zone)):
            utc = tick.astimezone(UTC)
            if utc > end or count == COUNT_LIMIT:
                break
            count += utc > start
        return count

    def _latest_missed(
        self, start: datetime, end: datetime, keep: int, late: datetime | None
    ) -> list[datetime]:
        """The ``keep`` latest ticks in (start, end] other than ``late``, oldest first: walked
        backwards, so a long downtime costs only the ticks kept."""
        found: list[datetime] = []
        t = end
        while t > start and len(found) < keep:
            if t != late:
                found.append(t)
            t = self.at_or_before(t - _US)
        found.reverse()
        return found
