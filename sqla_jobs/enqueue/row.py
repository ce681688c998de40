"""The columns enqueue writes to a job row: the one list of them, in order, and the two shapes a
checked row takes on its way there (:class:`Prepared`, one job; :class:`Batch`, many as columns).

Everything that names them derives from :data:`~sqla_jobs.sql.columns.COLUMNS`: the INSERT statements and COPY's column
list (:mod:`sqla_jobs.sql.enqueue`), the COPY text (:mod:`sqla_jobs.enqueue.copy_rows`), the ``Job`` enqueue
returns (:mod:`sqla_jobs.enqueue.insert`) and the batches validation builds (:mod:`sqla_jobs.enqueue.validate`).
A new column is one :class:`Column` here and one field of :class:`Prepared`; validation computes
its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqla_jobs.kinds import Kind
from sqla_jobs.sql.columns import COLUMNS as COLUMNS
from sqla_jobs.sql.columns import NAMES as NAMES
from sqla_jobs.sql.columns import OPTIONAL as OPTIONAL
from sqla_jobs.sql.columns import Column as Column
from sqla_jobs.unique import UniqueKey


@dataclass(frozen=True)
class Prepared:
    """One validated job, ready to insert: a field per :data:`COLUMNS` entry."""

    kind: Kind
    #: The JSON text.
    payload: str
    queue: str
    priority: int
    max_attempts: int
    max_crashes: int
    concurrency_key: str | None
    concurrency_limit: int | None
    #: The JSON text of the job's ``meta`` object; None when it has none (SQL NULL).
    meta: str | None = None
    #: The rate limiter the job counts against (:func:`~sqla_jobs.rate_limit.rate_key`); None
    #: for a kind without a rate limit.
    rate_key: str | None = None
    #: A unique job's key; None for the others. Not one of :data:`COLUMNS`: unique jobs take
    #: their own statements (``INSERT ... ON CONFLICT``), and the plain ones never pay for it.
    unique: UniqueKey | None = None

    def values(self) -> list[Any]:
        """The row's values, in :data:`COLUMNS` order."""
        return [self.kind.name if n == "kind" else getattr(self, n) for n in NAMES]


class Batch:
    """Validated jobs as parallel lists, one per :data:`COLUMNS` entry in its order, in payload
    order: what ``enqueue_many`` writes."""

    __slots__ = ("columns", "unique")

    def __init__(self) -> None:
        self.columns: list[list[Any]] = [[] for _ in COLUMNS]
        #: Per job, its unique key or None; None for a batch without unique jobs.
        self.unique: list[UniqueKey | None] | None = None

    def __len__(self) -> int:
        return len(self.columns[0])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Batch) and self.columns == other.columns

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Batch({dict(zip(NAMES, self.columns, strict=True))!r})"

    def column(self, name: str) -> list[Any]:
        """The values of column ``name``."""
        return self.columns[NAMES.index(name)]

    def add(self, job: Prepared) -> None:
        """Append one job."""
        n = len(self)
        for column, value in zip(self.columns, job.values(), strict=True):
            column.append(value)
        if job.unique is not None or self.unique is not None:
            if self.unique is None:
                self.unique = [None] * n
            self.unique.append(job.unique)

    def add_run(self, template: Prepared, varying: dict[str, list[Any]]) -> None:
        """Append jobs that share ``template``'s values but for the ``varying`` columns (one value
        per job each): a run of one kind and options, filled a column at a time."""
        n = len(next(iter(varying.values())))
        for name, column, value in zip(NAMES, self.columns, template.values(), strict=True):
            column += varying[name] if name in varying else [value] * n
        if self.unique is not None:
            self.unique += [None] * n

    def absorb(self, other: Batch) -> None:
        """Append ``other``'s jobs after this batch's."""
        n = len(self)
        for mine, theirs in zip(self.columns, other.columns, strict=True):
            mine += theirs
        if other.unique is not None or self.unique is not None:
            self.unique = (self.unique or [None] * n) + (other.unique or [None] * len(other))
