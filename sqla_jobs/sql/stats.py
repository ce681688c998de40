"""The queue's statistics for ``sqla-jobs stats`` and the dashboard: counts by queue or kind and
state, the job table's health, and the oldest transaction holding vacuum back. Plain reads.
"""

from __future__ import annotations

from sqlalchemy import (
    Select,
    and_,
    func,
    select,
    text,
)

from sqla_jobs.sql.tables import (
    PENDING,
    job,
)

__all__ = [
    "oldest_transaction",
    "stats_by_kind",
    "stats_by_queue",
    "table_health",
]


def stats_by_queue() -> Select[tuple[str, str, int, object]]:
    """Count jobs per queue and state, with the age of the oldest *due* pending job (the true
    queue latency). A full scan of the (small, history-free) table; no locks."""
    due_age = func.max(func.now() - job.c.run_at).filter(
        and_(job.c.state == PENDING, job.c.run_at <= func.now())
    )
    return (
        select(job.c.queue, job.c.state, func.count().label("jobs"), due_age.label("oldest_due"))
        .group_by(job.c.queue, job.c.state)
        .order_by(job.c.queue, job.c.state)
    )


def stats_by_kind() -> Select[tuple[str, str, int, object]]:
    """Count jobs per kind and state, with the age of the oldest *due* pending job of the kind:
    :func:`stats_by_queue` per kind. A full scan of the table; no locks."""
    due_age = func.max(func.now() - job.c.run_at).filter(
        and_(job.c.state == PENDING, job.c.run_at <= func.now())
    )
    return (
        select(job.c.kind, job.c.state, func.count().label("jobs"), due_age.label("oldest_due"))
        .group_by(job.c.kind, job.c.state)
        .order_by(job.c.kind, job.c.state)
    )


def table_health() -> Select[tuple[object, ...]]:
    """Dead tuples, live tuples, last (auto)vacuum and size of the queue table in ``schema``
    (NULL: the first schema of the search_path), from ``pg_stat_user_tables``."""
    return select(
        text(
            "n_live_tup, n_dead_tup, last_autovacuum, last_vacuum, autovacuum_count, "
            "pg_total_relation_size(relid) AS total_bytes "
            "FROM pg_stat_user_tables "
            "WHERE relname = 'sqla_jobs_job' "
            "AND schemaname = coalesce(CAST(:schema AS text), current_schema())"
        )
    )


def oldest_transaction() -> Select[tuple[object, ...]]:
    """The oldest open transaction holding back this database's xmin horizon (its age, pid, state,
    and the first 100 characters of its query): what stops vacuum from removing the queue's dead
    tuples.

    A transaction holds the horizon back through its snapshot (``backend_xmin``) or through its own
    transaction id (``backend_xid``): a session idle in a transaction that wrote something holds
    no snapshot, yet pins every row version that died after it began. Transactions in other
    databases do not hold back this database's tables and are left out; backends of no database
    (a walsender with ``hot_standby_feedback``) are kept.
    """
    return select(
        text(
            "now() - xact_start AS age, pid, state, left(query, 100) AS query "
            "FROM pg_stat_activity "
            "WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) "
            "AND (datname = current_database() OR datname IS NULL) "
            "AND pid <> pg_backend_pid() "
            "ORDER BY xact_start LIMIT 1"
        )
    )
