"""Retry policies: pure descriptions of how long to wait after the n-th handler failure.

The delay is applied by the database (``run_at = now() + delay``) inside the fail statement, from the
row's own counters, so no Python clock is ever involved and two racing writers compute the same
schedule. :meth:`Backoff.delay` mirrors the SQL for documentation and tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqla_jobs.errors import ConfigurationError


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``min(base ** failures, cap)`` seconds, stretched by up to ``jitter``.

    ``failures`` counts handler failures including the one being recorded (1 after the first), so the
    default schedule is 2 s, 4 s, 8 s, ... capped at one hour. ``jitter`` (0 to 1) multiplies the
    delay by a random factor in ``[1, 1 + jitter)`` drawn by the database, so that jobs failed by one
    outage do not all come back in the same second.
    """

    base: float = 2.0
    cap_seconds: float = 3600.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.base < 1:
            raise ConfigurationError(f"Backoff.base must be >= 1, got {self.base}")
        if self.cap_seconds < 0:
            raise ConfigurationError(f"Backoff.cap_seconds must be >= 0, got {self.cap_seconds}")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError(f"Backoff.jitter must be within [0, 1], got {self.jitter}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure, before jitter."""
        if failures < 0:
            raise ValueError("failures must be >= 0")
        # Same operations as the SQL: the exponent bounded by exp_cap, then power(), then least().
        return min(self.base ** min(failures, self.exp_cap), self.cap_seconds)

    @property
    def exp_cap(self) -> int:
        """The largest exponent the SQL needs: past it ``base ** n`` exceeds the cap anyway, and
        bounding it keeps ``power()`` from overflowing a double."""
        if self.base == 1 or self.cap_seconds <= 1:
            return 1
        return min(1000, math.ceil(math.log(self.cap_seconds) / math.log(self.base)) + 1)

    def sql_params(self) -> dict[str, float | int]:
        """The bound parameters of :func:`sqla_jobs.sql.outcomes.fail` for this policy."""
        return {
            "base": self.base,
            "cap": self.cap_seconds,
            "jitter": self.jitter,
            "exp_cap": self.exp_cap,
        }

    def bounds(self, failures: int) -> tuple[float, float]:
        """The interval the database may pick from, jitter included: ``[delay, delay * (1 + jitter)]``."""
        d = self.delay(failures)
        return d, d * (1 + self.jitter)


DEFAULT_BACKOFF = Backoff()
