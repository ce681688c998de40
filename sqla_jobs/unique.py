"""Unique jobs: at most one job per key among the jobs in the states that count for it.

A kind declares what makes two of its jobs the same (:class:`Unique`), or an enqueue names the key
itself (``unique_key=``). The key is held by a partial unique index of the job table (shipped in the
package's migrations), so it is exact across transactions and processes: never a check-then-insert.
This module is pure: it checks the declarations and computes keys; the SQL is in
:mod:`sqla_jobs.sql.unique` and the enqueue paths in :mod:`sqla_jobs.enqueue.unique`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel

from sqla_jobs.errors import InvalidOptionError
from sqla_jobs.model import ALWAYS_UNIQUE_STATES, HELD_UNIQUE_STATES, STATES

#: What enqueue does when a job with the same key is already there: return it (``"skip"``),
#: update its payload, run_at, priority and meta if it is still pending (``"replace"``), or raise
#: :class:`~sqla_jobs.DuplicateJobError` (``"raise"``). Never an aborted transaction.
OnConflict = Literal["skip", "replace", "raise"]
ON_CONFLICT: tuple[str, ...] = ("skip", "replace", "raise")


def check_on_conflict(value: object) -> None:
    """Raise :class:`InvalidOptionError` unless ``value`` is an ``on_conflict`` choice."""
    if value not in ON_CONFLICT:
        raise InvalidOptionError(
            f"on_conflict must be one of {', '.join(map(repr, ON_CONFLICT))}, got {value!r}"
        )


#: Keys longer than this are stored as their SHA-256 (the index entry stays small).
MAX_KEY_CHARS = 200


@dataclass(frozen=True)
class Unique:
    """What makes two jobs of a kind the same job.

    ``by``: the payload fields that make up the key (None: the whole payload; ``()``: the kind
    alone, one job of the kind at a time). ``states``: the states in which a job holds its key;
    ``pending``, ``running`` and ``waiting`` always count, whatever is given, so that no move a
    worker makes on its own (claim, failure and retry, reap, give-back, snooze, a dependency's
    release) can collide with another job's key. Add ``"dead"``, ``"cancelled"`` or ``"completed"`` to keep a key taken by a finished job
    until retention removes it. ``period``: the key is per period (whole seconds), counted in
    fixed windows since the Unix epoch from the job's ``run_at`` (a job due in another window is
    another job). ``by_queue``: jobs of one key in different queues are different jobs.
    """

    by: tuple[str, ...] | None = None
    states: tuple[str, ...] = ALWAYS_UNIQUE_STATES
    period: timedelta | None = None
    by_queue: bool = False

    def check(self, model: type[BaseModel]) -> Unique:
        """This declaration, normalized (``states`` with pending and running, in a fixed order),
        or ``ValueError`` saying what cannot work for ``model``."""
        by = self.by
        if isinstance(by, str):
            by = (by,)
        if by is not None:
            if not all(isinstance(f, str) for f in by):
                raise ValueError(f"Unique(by=...) takes payload field names, got {self.by!r}")
            unknown = [f for f in by if f not in model.model_fields]
            if unknown:
                raise ValueError(
                    f"Unique(by=...) names {', '.join(map(repr, unknown))}, not fields of "
                    f"{model.__qualname__} (fields: {', '.join(model.model_fields)})"
                )
        states = _states(self.states)
        period = self.period
        if period is not None:
            if not isinstance(period, timedelta) or period < timedelta(seconds=1):
                raise ValueError(
                    f"Unique(period=...) must be a timedelta of 1 s or more: {period!r}"
                )
            if period % timedelta(seconds=1):
                raise ValueError(f"Unique(period=...) must be whole seconds, got {period}")
        return Unique(by=by, states=states, period=period, by_queue=bool(self.by_queue))

    @property
    def period_seconds(self) -> int | None:
        return None if self.period is None else int(self.period.total_seconds())


def _states(states: Sequence[str]) -> tuple[str, ...]:
    if isinstance(states, str) or not all(isinstance(s, str) for s in states):
        raise ValueError(f"Unique(states=...) takes a sequence of state names, got {states!r}")
    unknown = [s for s in states if s not in STATES]
    if unknown:
        raise ValueError(
            f"Unique(states=...) names unknown state(s) {', '.join(map(repr, unknown))}; "
            f"states are {', '.join(STATES)}"
        )
    wanted = {*states, *HELD_UNIQUE_STATES}
    return tuple(s for s in STATES if s in wanted)


@dataclass(frozen=True)
class UniqueKey:
    """A job's key as enqueue writes it: ``key`` (kind, then what it is unique by; the period's
    window is appended by the database, from the job's run_at), the counted ``states`` and the
    period in seconds."""

    key: str
    states: tuple[str, ...]
    period: int | None


def key_of(
    kind: str, unique: Unique, payload_json: str, queue: str, explicit: str | None
) -> UniqueKey:
    """The key of a job of ``kind`` whose payload serialized as ``payload_json``: ``explicit``
    if given, else the ``unique.by`` fields of the payload as canonical JSON (sorted keys, no
    spaces), so that equal payloads give equal keys whatever their field order."""
    if explicit is not None:
        body = explicit
    else:
        data = json.loads(payload_json)
        if unique.by is not None:
            data = {f: data.get(f) for f in unique.by}
        body = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    key = f"{kind}:{body}"
    if unique.by_queue:
        key = f"{key}|queue={queue}"
    if len(key) > MAX_KEY_CHARS:
        key = f"{kind}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"
    return UniqueKey(key=key, states=unique.states, period=unique.period_seconds)


class EnqueuedIds(list[int]):
    """The ids :meth:`~sqla_jobs.Jobs.enqueue_many` returns, in payload order (a duplicate's
    id is the job that holds its key), and which of them this call inserted."""

    def __init__(
        self,
        ids: Sequence[int] = (),
        inserted: Sequence[bool] | None = None,
        replaced: Sequence[bool] | None = None,
    ) -> None:
        super().__init__(ids)
        self._inserted = None if inserted is None else list(inserted)
        self._replaced = None if replaced is None else list(replaced)

    @property
    def inserted(self) -> list[bool]:
        """Per payload: whether this call inserted its job (False: a job with its unique key was
        already there, or came earlier in the same call)."""
        return [True] * len(self) if self._inserted is None else list(self._inserted)

    @property
    def replaced(self) -> list[bool]:
        """Per payload: whether it replaced the payload of the pending job holding its key
        (``on_conflict="replace"``)."""
        return [False] * len(self) if self._replaced is None else list(self._replaced)

    @property
    def duplicates(self) -> list[int]:
        """The positions of the payloads that were not inserted."""
        return [i for i, new in enumerate(self.inserted) if not new]
