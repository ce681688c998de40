"""``sqla-jobs stats``: what a person on call needs from the queue table, in one screen.

Per queue: jobs by state and the age of the oldest *due* pending job (the true queue latency).
For the table: dead tuples and the last autovacuum (MVCC is the real capacity limit), and the
oldest open transaction, which holds back the xmin horizon so vacuum cannot remove dead tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from . import statements
from ._db import sqlalchemy_url

#: An open transaction older than this gets a warning: it pins dead tuples in place.
OLD_TRANSACTION = timedelta(minutes=5)


@dataclass
class Stats:
    """A snapshot of the queue."""

    #: (queue, state, jobs, oldest due age or None)
    rows: list[tuple[str, str, int, timedelta | None]] = field(default_factory=list)
    table: dict[str, Any] = field(default_factory=dict)
    oldest_transaction: dict[str, Any] | None = None
    #: Warn about a transaction open longer than this (None: :data:`OLD_TRANSACTION`).
    old_transaction: timedelta | None = None

    @property
    def warnings(self) -> list[str]:
        out = []
        tx = self.oldest_transaction
        limit = OLD_TRANSACTION if self.old_transaction is None else self.old_transaction
        if tx is not None and tx["age"] is not None and tx["age"] > limit:
            out.append(
                f"transaction open for {_age(tx['age'])} (pid {tx['pid']}, {tx['state']}): it holds "
                "back vacuum, so the queue's dead tuples cannot be removed"
            )
        return out


def collect(
    url: str, *, schema: str | None = None, old_transaction: timedelta | None = None
) -> Stats:
    """Read the snapshot (no locks taken). ``old_transaction``: warn about a transaction open
    longer than this (default :data:`OLD_TRANSACTION`, 5 minutes)."""
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    opts = {} if schema is None else {"schema_translate_map": {None: schema}}
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(**opts)
            rows = [
                (r.queue, r.state, int(r.jobs), r.oldest_due)
                for r in conn.execute(statements.stats_by_queue())
            ]
            health = conn.execute(statements.table_health(), {"schema": schema}).mappings().first()
            oldest = conn.execute(statements.oldest_transaction()).mappings().first()
    finally:
        engine.dispose()
    return Stats(
        rows=rows,
        table=dict(health) if health else {},
        oldest_transaction=dict(oldest) if oldest else None,
        old_transaction=old_transaction,
    )


def _age(age: timedelta | None) -> str:
    if age is None:
        return "-"
    seconds = age.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def render(stats: Stats) -> str:
    """The snapshot as a plain-text table."""
    queues: dict[str, dict[str, Any]] = {}
    for queue, state, jobs, oldest in stats.rows:
        q = queues.setdefault(queue, {"pending": 0, "running": 0, "dead": 0, "oldest": None})
        q[state] = jobs
        if oldest is not None:
            q["oldest"] = oldest
    lines = [f"{'queue':<20} {'pending':>9} {'running':>9} {'dead':>9} {'oldest due':>12}"]
    for name, q in sorted(queues.items()):
        lines.append(
            f"{name:<20} {q['pending']:>9} {q['running']:>9} {q['dead']:>9} {_age(q['oldest']):>12}"
        )
    if not queues:
        lines.append("(no jobs)")
    t = stats.table
    if t:
        lines.append("")
        lines.append(
            f"table sqla_jobs_job: {t['n_live_tup']} live, {t['n_dead_tup']} dead tuples, "
            f"{t['total_bytes'] / 1024:.0f} KiB with indexes; last autovacuum "
            f"{t['last_autovacuum'] or 'never'} ({t['autovacuum_count']} runs)"
        )
    for w in stats.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)
