"""``sqla-jobs stats``: what a person on call needs from the queue table, in one screen.

Per queue: jobs by state and the age of the oldest *due* pending job (the true queue latency).
For the table: dead tuples and the last autovacuum (MVCC is the real capacity limit), and the
oldest open transaction, which holds back the xmin horizon so vacuum cannot remove dead tuples.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs.db.replica import position, retrying_conflicts
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.jobs import Jobs
from sqla_jobs.model import STATES
from sqla_jobs.sql import listings as listings_sql
from sqla_jobs.sql import stats as stats_sql
from sqla_jobs.sql import workers as workers_sql

#: An open transaction older than this gets a warning: it pins dead tuples in place.
OLD_TRANSACTION = timedelta(minutes=5)


@dataclass
class Stats:
    """A snapshot of the queue."""

    #: (queue, state, jobs, oldest due age or None)
    rows: list[tuple[str, str, int, timedelta | None]] = field(default_factory=list)
    #: (kind, state, jobs, oldest due age or None)
    kinds: list[tuple[str, str, int, timedelta | None]] = field(default_factory=list)
    #: Queues an operator touched: name -> paused since (None: active again).
    paused: dict[str, datetime | None] = field(default_factory=dict)
    table: dict[str, Any] = field(default_factory=dict)
    oldest_transaction: dict[str, Any] | None = None
    #: Warn about a transaction open longer than this (None: :data:`OLD_TRANSACTION`).
    old_transaction: timedelta | None = None
    #: With a read URL: where the counts were read (``replica``, or ``primary`` for a read URL
    #: that points at one), where the table's health and the oldest transaction were (the
    #: statistics and sessions of the server they ran on), and how far behind the primary the
    #: replica is, in WAL bytes (None: not known).
    read_from: dict[str, str] | None = None
    lag_bytes: int | None = None

    @property
    def warnings(self) -> list[str]:
        out = []
        tx = self.oldest_transaction
        limit = OLD_TRANSACTION if self.old_transaction is None else self.old_transaction
        if tx is not None and tx["age"] is not None and tx["age"] > limit:
            on = "" if self.read_from is None else f" on the {self.read_from['table']}"
            out.append(
                f"transaction open for {_age(tx['age'])}{on} (pid {tx['pid']}, {tx['state']}): it "
                "holds back vacuum, so the queue's dead tuples cannot be removed"
            )
        return out


def collect(
    url: str | None,
    *,
    schema: str | None = None,
    old_transaction: timedelta | None = None,
    read_url: str | None = None,
) -> Stats:
    """Read the snapshot (no locks taken). ``old_transaction``: warn about a transaction open
    longer than this (default :data:`OLD_TRANSACTION`, 5 minutes).

    ``read_url``: a replica's URL, where the counts are read. The table's health and the oldest
    transaction describe the server they are read on, so they come from the primary (``url``)
    when it is given, else from the replica, and ``read_from`` says which; with both, the
    replica's lag in WAL bytes. A read the replica cancels for a recovery conflict runs once more
    (:func:`~sqla_jobs.db.replica.retrying_conflicts`)."""
    counted_on = read_url or url
    if counted_on is None:
        raise ValueError("collect needs a database URL, a read URL, or both")
    opts = {} if schema is None else {"schema_translate_map": {None: schema}}

    def counts() -> tuple[Any, ...]:
        with _connect(counted_on) as conn:
            conn = conn.execution_options(**opts)
            rows = [
                (r.queue, r.state, int(r.jobs), r.oldest_due)
                for r in conn.execute(stats_sql.stats_by_queue())
            ]
            kinds = [
                (r.kind, r.state, int(r.jobs), r.oldest_due)
                for r in conn.execute(stats_sql.stats_by_kind())
            ]
            paused = {r.queue: r.paused_at for r in conn.execute(listings_sql.list_queue_states())}
            at = position(conn) if read_url is not None else None
            if read_url is not None and url is not None:
                return rows, kinds, paused, at, None, None
            health = conn.execute(stats_sql.table_health(), {"schema": schema}).mappings().first()
            oldest = conn.execute(stats_sql.oldest_transaction()).mappings().first()
            return rows, kinds, paused, at, health, oldest

    rows, kinds, paused, at, health, oldest = retrying_conflicts(counts, "the replica")
    stats = Stats(rows=rows, kinds=kinds, paused=paused, old_transaction=old_transaction)
    if read_url is not None and at is not None:
        replica = "replica" if at.standby else "primary"
        stats.read_from = {"queues": replica, "table": replica}
        if url is not None:
            with _connect(url) as conn:
                health = (
                    conn.execute(stats_sql.table_health(), {"schema": schema}).mappings().first()
                )
                oldest = conn.execute(stats_sql.oldest_transaction()).mappings().first()
                primary = position(conn)
            stats.read_from["table"] = "primary"
            if primary.lsn is not None and at.lsn is not None:
                stats.lag_bytes = max(primary.lsn - at.lsn, 0) if at.standby else 0
    stats.table = dict(health) if health else {}
    stats.oldest_transaction = dict(oldest) if oldest else None
    return stats


@contextmanager
def _connect(url: str) -> Iterator[Connection]:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


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
    where = stats.read_from
    for name, q in sorted(queues.items()):
        lines.append(
            f"{name:<20} {q['pending']:>9} {q['running']:>9} {q['dead']:>9} {_age(q['oldest']):>12}"
        )
    if not queues:
        lines.append("(no jobs)")
    if where is not None:
        lag = "lag unknown" if stats.lag_bytes is None else f"{stats.lag_bytes} bytes of WAL behind"
        lines.append(
            f"(counts read from the replica, {lag} the primary)"
            if where["queues"] == "replica"
            else "(counts read from the read URL's server, a primary)"
        )
    t = stats.table
    if t:
        lines.append("")
        on = "" if where is None else f" (on the {where['table']})"
        lines.append(
            f"table sqla_jobs_job{on}: {t['n_live_tup']} live, {t['n_dead_tup']} dead tuples, "
            f"{t['total_bytes'] / 1024:.0f} KiB with indexes; last autovacuum "
            f"{t['last_autovacuum'] or 'never'} ({t['autovacuum_count']} runs)"
        )
    for w in stats.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def by_state(
    rows: list[tuple[str, str, int, timedelta | None]],
) -> dict[str, dict[str, Any]]:
    """(name, state, jobs, oldest due) rows as name -> {state: jobs, ..., "oldest_due": age}, every
    state present (0 when none)."""
    out: dict[str, dict[str, Any]] = {}
    for name, state, jobs, oldest in rows:
        entry = out.setdefault(name, {s: 0 for s in STATES} | {"oldest_due": None})
        entry[state] = jobs
        if oldest is not None:
            entry["oldest_due"] = oldest
    return out


def _seconds(age: timedelta | None) -> float | None:
    return None if age is None else round(age.total_seconds(), 3)


def render_json(stats: Stats) -> str:
    """The snapshot as one JSON object: ``queues`` and ``kinds`` (jobs by state and
    ``oldest_due_seconds``; queues also ``paused``), ``table``, ``oldest_transaction`` and
    ``warnings``. Times are ISO 8601, ages in seconds."""

    def entries(rows: list[tuple[str, str, int, timedelta | None]]) -> dict[str, Any]:
        return {
            name: {s: e[s] for s in STATES} | {"oldest_due_seconds": _seconds(e["oldest_due"])}
            for name, e in sorted(by_state(rows).items())
        }

    queues = entries(stats.rows)
    for name in stats.paused:
        queues.setdefault(name, {s: 0 for s in STATES} | {"oldest_due_seconds": None})
    for name, q in queues.items():
        q["paused"] = stats.paused.get(name) is not None
    tx = None
    if stats.oldest_transaction is not None:
        tx = {k: v for k, v in stats.oldest_transaction.items() if k != "age"}
        tx["age_seconds"] = _seconds(stats.oldest_transaction.get("age"))
    out: dict[str, Any] = {
        "queues": dict(sorted(queues.items())),
        "kinds": entries(stats.kinds),
        "table": stats.table,
        "oldest_transaction": tx,
        "warnings": stats.warnings,
    }
    if stats.read_from is not None:
        out["read_from"] = stats.read_from
        out["lag_bytes"] = stats.lag_bytes
    return json.dumps(out, default=_json_default)


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


def queue_overview(session: Session, jobs: Jobs) -> dict[str, dict[str, Any]]:
    """Per queue: jobs by state, the oldest due job's age, since when it is paused (None:
    active), and the live workers serving it (``workers``) with their handler slots (``slots``);
    queues with no jobs that an operator paused or resumed, or that a live worker serves, are
    included."""
    options = {} if jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}
    rows = [
        (r.queue, r.state, int(r.jobs), r.oldest_due)
        for r in session.execute(stats_sql.stats_by_queue(), execution_options=options)
    ]
    queues = by_state(rows)

    def entry(queue: str) -> dict[str, Any]:
        return queues.setdefault(queue, {s: 0 for s in STATES} | {"oldest_due": None})

    for r in session.execute(listings_sql.list_queue_states(), execution_options=options):
        entry(r.queue)["paused_at"] = r.paused_at
    for w in session.execute(workers_sql.list_workers(), execution_options=options):
        if w.stale:
            continue
        for queue in w.queues:
            served = entry(queue)
            served["workers"] = served.get("workers", 0) + 1
            served["slots"] = served.get("slots", 0) + int(w.concurrency)
    return dict(sorted(queues.items()))
