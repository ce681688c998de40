"""What an operation by filter (retry, delete or cancel without ids) would touch, counted before
it runs: for ``--dry-run``, the CLI's prompt and the dashboard's confirmation page.

The count reads the filter the operation itself runs (:func:`sqla_jobs.sql.operations.peek_jobs`
and ``count_jobs`` share ``find_jobs``' WHERE), so the two cannot disagree about which jobs
match; it locks nothing and changes nothing. A run after a confirmation is bounded by
:meth:`Preview.bound`: it touches only jobs the count listed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy.orm import Session

from sqla_jobs.operations.jobs import FILTER_LIMIT, FILTER_STATES, Bound, Scope, _check_queue
from sqla_jobs.sql import operations as operations_sql

_PEEK = operations_sql.peek_jobs()
_COUNT = operations_sql.count_jobs()
#: Ids a description lists before "and N more".
SHOWN_IDS = 20


@dataclass(frozen=True)
class Preview:
    """The jobs an operation ``verb`` by filter would touch now: the first ones it runs on
    (``touched``: id and state, oldest id first, at most :data:`FILTER_LIMIT`) and how many
    match in all, by state (``matching``: the run is capped, the count is not)."""

    verb: str
    kind: str | None
    queue: str | None
    touched: tuple[tuple[int, str], ...]
    matching: dict[str, int]

    @property
    def ids(self) -> list[int]:
        return [i for i, _ in self.touched]

    @property
    def total(self) -> int:
        """How many jobs match, beyond the cap too."""
        return sum(self.matching.values())

    @property
    def capped(self) -> bool:
        return self.total > len(self.touched)

    def bound(self) -> Bound:
        """What a run confirmed on this count may touch: these jobs, and no other."""
        return Bound(
            max_id=self.touched[-1][0] if self.touched else 0,
            limit=len(self.touched),
            ids=tuple(self.ids),
        )

    def digest(self) -> str:
        """A short fingerprint of the jobs counted (their ids), for a confirmation to carry."""
        return hashlib.sha256(",".join(map(str, self.ids)).encode()).hexdigest()[:32]

    def where(self) -> str:
        """The filter, said: ``queue mail, any kind``."""
        queue = f"queue {self.queue}" if self.queue else "any queue"
        kind = f"kind {self.kind}" if self.kind else "any kind"
        return f"{queue}, {kind}"

    def jobs(self) -> str:
        """What the run touches, by state: ``3 dead jobs``, ``2 pending jobs and 1 running job``
        (``no dead jobs`` when none match)."""
        states = FILTER_STATES[self.verb]
        if not self.touched:
            return f"no {' or '.join(states)} jobs"
        counts = {s: sum(1 for _, t in self.touched if t == s) for s in states}
        parts = [f"{_number(n)} {s} job{'' if n == 1 else 's'}" for s, n in counts.items() if n]
        return " and ".join(parts)

    def listed(self) -> str:
        """The ids it touches, the first :data:`SHOWN_IDS` of them: ``ids 4, 5 and 98 more``."""
        ids = self.ids
        shown = ", ".join(map(str, ids[:SHOWN_IDS]))
        more = len(ids) - SHOWN_IDS
        return f"id{'' if len(ids) == 1 else 's'} {shown}" + (
            f" and {_number(more)} more" if more > 0 else ""
        )

    def cap(self) -> str:
        """The per-run cap, said plainly when the filter matches more than one run touches;
        ``""`` otherwise."""
        if not self.capped:
            return ""
        return (
            f"{_number(len(self.touched))} of {_number(self.total)} matching jobs: this run "
            f"touches the first {_number(FILTER_LIMIT)} (ids up to {self.touched[-1][0]}); run "
            "it again for the rest"
        )

    def lines(self) -> list[str]:
        """The whole description: what, where, which ids, and the cap when it applies."""
        head = f"{self.verb} {self.jobs()} ({self.where()})"
        if not self.touched:
            return [head + ": nothing to do"]
        return [f"{head}: {self.listed()}"] + ([self.cap()] if self.capped else [])


def preview(
    session: Session,
    scope: Scope,
    verb: str,
    *,
    kind: str | None = None,
    queue: str | None = None,
    max_id: int | None = None,
) -> Preview:
    """What ``verb`` (retry, delete or cancel) by filter would touch in the caller's transaction,
    within ``max_id`` when given; reads only."""
    if queue is not None:
        _check_queue(queue)
    params = {
        "states": list(FILTER_STATES[verb]),
        "kind": kind,
        "queue": queue,
        "max_id": max_id,
        "limit": FILTER_LIMIT,
    }
    options = scope.options
    touched = tuple(
        (int(i), str(s)) for i, s in session.execute(_PEEK, params, execution_options=options)
    )
    matching = {
        str(s): int(n) for s, n in session.execute(_COUNT, params, execution_options=options)
    }
    return Preview(verb, kind, queue, touched, matching)


def _number(n: int) -> str:
    return f"{n:,}"
