"""The rate limiters as an operator reads them (``sqla-jobs rate-limits``, the dashboard's queues
page): each limiter's kind and key, its limit, its starts in the window now, and when it admits
its next start, as its last claim left it. One plain read of the limiter table, no locks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from sqla_jobs.sql import limiters as limiters_sql

#: The fields of a :class:`Limiter`, in order (the CLI's JSON keys).
COLUMNS = ("kind", "key", "limit", "per_seconds", "used", "next_start_in_seconds", "latest_start")


@dataclass(frozen=True)
class Limiter:
    """One limiter: ``key`` is None for a kind's own limit (no ``by=``)."""

    kind: str
    key: str | None
    limit: int
    per_seconds: float
    used: int
    #: 0: it has room now.
    next_start_in_seconds: float
    #: ISO 8601, by the database's clock; None if it never started a job.
    latest_start: str | None

    @classmethod
    def of(cls, row: Any) -> Limiter:
        kind, _, key = str(row.rate_key).partition(" ")
        latest = row.latest.isoformat() if isinstance(row.latest, datetime) else None
        return cls(
            kind,
            key or None,
            int(row.allowed),
            float(row.per_seconds),
            int(row.used),
            round(float(row.next_in), 3),
            latest,
        )

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in COLUMNS)


def limiters(conn: Connection | Session, schema: str | None = None) -> list[Limiter]:
    """Every limiter a claim has written, by key, in ``schema``'s tables."""
    options = {} if schema is None else {"schema_translate_map": {None: schema}}
    rows = conn.execute(limiters_sql.list_rate_limiters(), execution_options=options)
    return [Limiter.of(row) for row in rows]
