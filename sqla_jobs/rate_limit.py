"""Rate limits: at most ``limit`` starts of a kind's jobs (or of one key's) in any window of
``per``, by the database's clock, across every worker.

This module is pure: it checks the declaration and computes a job's limiter key. The claim that
keeps the limit is in :mod:`sqla_jobs.sql.rate_limits`; the table in :mod:`sqla_jobs.model.limits`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqla_jobs.errors import InvalidOptionError, InvalidPayloadError, RegistryError

#: The longest key ``by=`` may return (as a concurrency key).
MAX_KEY_CHARS = 256


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` jobs of the kind start in any window of length ``per``.

    Exact: a log of each limiter's latest starts is kept in the database, and a claim admits a
    start only if fewer than ``limit`` of them fall in the ``per`` before it, by the database's
    clock; claims of one limiter are serialized by a row lock (claims of other limiters go on).
    A start is a claim: a job claimed and then given back (a prefetched job at a worker's
    shutdown, a run interrupted) has spent its start. ``by``: a function of the payload
    returning a str (1-256 characters), each key limited on its own, as ``concurrency_key``
    keys concurrency; without it the limit is the kind's. A job over its limit stays pending,
    spends no attempt, and is started as soon as the limit allows.
    """

    limit: int
    per: timedelta
    by: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise RegistryError(f"RateLimit limit must be an int >= 1, got {self.limit!r}")
        if not 1 <= self.limit <= 10_000:
            raise RegistryError(f"RateLimit limit must be in [1, 10000], got {self.limit}")
        if not isinstance(self.per, timedelta):
            raise RegistryError(
                f"RateLimit per must be a timedelta, got {type(self.per).__qualname__}"
            )
        if not self.per > timedelta(0) or not math.isfinite(self.per.total_seconds()):
            raise RegistryError(f"RateLimit per must be a positive duration, got {self.per}")
        if self.per < timedelta(milliseconds=1):
            raise RegistryError(f"RateLimit per must be at least 1 millisecond, got {self.per}")
        if self.by is not None and not callable(self.by):
            raise RegistryError("RateLimit by must be a function of the payload returning a str")


def rate_key(kind: str, limit: RateLimit | None, payload: Any) -> str | None:
    """The limiter a job of ``kind`` counts against: the kind's name, then its ``by`` key after a
    space (kind names hold no space); None without a limit. Raises
    :class:`~sqla_jobs.InvalidPayloadError` if ``by`` fails on the payload,
    :class:`~sqla_jobs.InvalidOptionError` if it returns no usable key."""
    if limit is None:
        return None
    if limit.by is None:
        return kind
    try:
        key = limit.by(payload)
    except Exception as exc:
        raise InvalidPayloadError(
            f"rate limit key (by=) of kind {kind!r} failed on this payload: {exc!r}"
        ) from None
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS or "\x00" in key:
        raise InvalidOptionError(
            f"rate limit key (by=) of kind {kind!r} must be a str of 1-{MAX_KEY_CHARS} "
            f"characters without NUL, got {key!r}"
        )
    return f"{kind} {key}"
