"""How long finished jobs are kept: :class:`Retention`, and the ``24h``/``7d`` durations it is
written in on the command line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from sqla_jobs.model import JobState

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
#: What ``--keep-*`` accepts for "never prune".
FOREVER = "forever"


@dataclass(frozen=True)
class Retention:
    """How long a worker's pruner keeps each kind of finished job, counted from ``finished_at``;
    ``None`` keeps them forever.

    ``completed`` covers succeeded jobs in ``sqla_jobs_history`` (``keep_history=True``) and the
    ``completed`` rows kept in the job table; ``dead`` and ``cancelled`` cover those states in the
    job table. Pending and running jobs are never pruned, whatever their age. The defaults are
    River's: a day for what went as planned, a week for what needs a look. ``throughput`` is how
    long the per-minute counts of ``sqla_jobs_throughput`` are kept, counted from their minute.
    """

    completed: timedelta | None = timedelta(hours=24)
    cancelled: timedelta | None = timedelta(hours=24)
    dead: timedelta | None = timedelta(days=7)
    throughput: timedelta | None = timedelta(hours=24)

    def __post_init__(self) -> None:
        for name, keep in {**self.by_state(), "throughput": self.throughput}.items():
            if keep is not None and keep < timedelta(0):
                raise ValueError(f"Retention.{name} must be >= 0 or None, got {keep}")

    def by_state(self) -> dict[str, timedelta | None]:
        """Each terminal state and how long it is kept."""
        return {
            JobState.COMPLETED.value: self.completed,
            JobState.DEAD.value: self.dead,
            JobState.CANCELLED.value: self.cancelled,
        }

    @property
    def prunes(self) -> bool:
        """Whether anything is ever pruned (False: everything kept forever)."""
        keeps = [*self.by_state().values(), self.throughput]
        return any(keep is not None for keep in keeps)


def parse_duration(text: str) -> timedelta:
    """``30s``, ``90m``, ``24h``, ``7d``, ``2w`` (or ``1.5h``) as a timedelta; ValueError naming
    the accepted forms otherwise."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(
            f"bad duration {text!r}: expected a number and a unit, s, m, h, d or w "
            "(e.g. 30s, 90m, 24h, 7d)"
        )
    return timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def format_duration(keep: timedelta | None) -> str:
    """A duration as :func:`parse_duration` reads it (``24h``, ``7d``, ``90m``): in days from two
    days up, else in the largest whole unit; None: forever."""
    if keep is None:
        return FOREVER
    seconds = keep.total_seconds()
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds and seconds % size == 0 and (unit != "d" or seconds >= 2 * size):
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


#: The retention a worker prunes by unless told otherwise (stated in the README).
DEFAULT_RETENTION = Retention()
