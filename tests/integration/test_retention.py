"""Retention on a real PostgreSQL: what the pruner deletes, who prunes, and that claims never wait.

Time is injected: a job "finished two days ago" because the test sets its ``finished_at`` so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import Engine

from sqla_jobs import Jobs, Retention
from sqla_jobs.db.connections import Connector
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.pruner import (
    EDGES,
    HISTORY,
    OUTCOMES,
    RATE_LIMITERS,
    THROUGHPUT,
    Pruner,
    PruneSQL,
    count,
    prune,
)
from tests.integration._workers import running_workers, wait_until

SQL = PruneSQL(None)
WORKER_SQL = WorkerSQL(None)
Conn = psycopg.Connection[tuple[Any, ...]]
DAY = timedelta(days=1)


@pytest.fixture
def conn(clean: Engine, migrated_url: str) -> Iterator[Conn]:
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as c:
        yield c


def add(conn: Conn, n: int, state: str, finished_ago: str | None, queue: str = "default") -> None:
    """``n`` jobs in ``state``, finished ``finished_ago`` (an interval) before now()."""
    running = state == "running"
    conn.execute(
        "INSERT INTO sqla_jobs_job (queue, kind, payload, state, finished_at, lease_token, "
        "lease_expires_at, locked_by, run_at) "
        "SELECT %(queue)s, 'k', '{}', %(state)s, now() - CAST(%(ago)s AS interval), "
        "CASE WHEN %(running)s THEN gen_random_uuid() END, "
        "CASE WHEN %(running)s THEN now() + interval '1 hour' END, "
        "CASE WHEN %(running)s THEN 'w' END, now() - interval '30 days' "
        "FROM generate_series(1, %(n)s)",
        {"queue": queue, "state": state, "ago": finished_ago, "running": running, "n": n},
    )


def add_history(conn: Conn, n: int, finished_ago: str) -> None:
    conn.execute(
        "INSERT INTO sqla_jobs_history (id, queue, kind, payload, attempts, crashes, created_at, "
        "finished_at) SELECT coalesce((SELECT max(id) FROM sqla_jobs_history), 0) + g, "
        "'default', 'k', '{}', 1, 0, now() - interval '30 days', now() - CAST(%s AS interval) "
        "FROM generate_series(1, %s) g",
        (finished_ago, n),
    )


def left(conn: Conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state, count(*) FROM sqla_jobs_job GROUP BY 1 "
        "UNION ALL SELECT 'history', count(*) FROM sqla_jobs_history"
    ).fetchall()
    return {state: n for state, n in rows if n}


def fill(conn: Conn) -> None:
    """For each outcome, rows just inside and just outside the default retention, and pending and
    running jobs older than any of it."""
    add(conn, 3, "completed", "25 hours")
    add(conn, 2, "completed", "23 hours")
    add(conn, 4, "cancelled", "25 hours")
    add(conn, 1, "cancelled", "1 hour")
    add(conn, 5, "dead", "8 days")
    add(conn, 6, "dead", "6 days")
    add(conn, 7, "pending", None)
    add(conn, 2, "running", None)
    add_history(conn, 10, "25 hours")
    add_history(conn, 3, "2 hours")


def test_each_outcome_loses_exactly_its_expired_rows_and_pending_and_running_jobs_stay(
    conn: Conn,
) -> None:
    fill(conn)
    assert count(conn, SQL, Retention().by_state()) == {
        "completed": 3,
        HISTORY: 10,
        "dead": 5,
        "cancelled": 4,
    }
    deleted = prune(conn, SQL, Retention().by_state(), batch=2)
    assert deleted == {"completed": 3, HISTORY: 10, "dead": 5, "cancelled": 4, OUTCOMES: 0}
    assert left(conn) == {
        "completed": 2,
        "cancelled": 1,
        "dead": 6,
        "pending": 7,
        "running": 2,
        "history": 3,
    }
    # Nothing is left that the retention does not keep: a second run deletes nothing.
    assert sum(prune(conn, SQL, Retention().by_state()).values()) == 0


def test_a_state_kept_forever_is_never_pruned(conn: Conn) -> None:
    fill(conn)
    deleted = prune(conn, SQL, Retention(dead=None, completed=None).by_state())
    assert deleted == {"cancelled": 4}
    assert left(conn)["dead"] == 11
    assert left(conn)["history"] == 13


def test_pending_and_running_jobs_survive_a_zero_retention(conn: Conn) -> None:
    add(conn, 3, "pending", None)
    add(conn, 2, "running", None)
    # A terminal state with finished_at set, but not finished yet, per the clock: the future.
    add(conn, 1, "dead", "-1 hour")
    zero = Retention(completed=timedelta(0), dead=timedelta(0), cancelled=timedelta(0))
    assert sum(prune(conn, SQL, zero.by_state()).values()) == 0
    assert left(conn) == {"pending": 3, "running": 2, "dead": 1}


def test_a_batch_deletes_at_most_its_limit_in_its_own_transaction(conn: Conn) -> None:
    add(conn, 25, "dead", "8 days")
    params = SQL.prune_jobs.params(
        state="dead", older_than_us=7 * 86_400_000_000, limit=10, skip=[]
    )
    counts = [conn.execute(SQL.prune_jobs.sql, params).rowcount for _ in range(4)]
    assert counts == [10, 10, 5, 0]


def test_the_prune_steps_over_a_row_someone_holds_instead_of_waiting(
    conn: Conn, migrated_url: str
) -> None:
    add(conn, 3, "dead", "8 days")
    held = conn.execute("SELECT min(id) FROM sqla_jobs_job").fetchone()
    assert held is not None
    with psycopg.connect(libpq_conninfo(migrated_url)) as operator:
        operator.execute("SELECT 1 FROM sqla_jobs_job WHERE id = %s FOR UPDATE", (held[0],))
        conn.execute("SET lock_timeout = '2s'")
        assert prune(conn, SQL, {"dead": timedelta(days=7)}) == {"dead": 2, OUTCOMES: 0}
        operator.rollback()
    assert prune(conn, SQL, {"dead": timedelta(days=7)}) == {"dead": 1, OUTCOMES: 0}


def test_a_completed_row_the_application_still_references_is_kept_and_the_rest_pruned(
    conn: Conn,
) -> None:
    add(conn, 5, "completed", "2 days")
    ids = [r[0] for r in conn.execute("SELECT id FROM sqla_jobs_job ORDER BY finished_at, id")]
    conn.execute("DROP TABLE IF EXISTS app_invoice")
    conn.execute("CREATE TABLE app_invoice (job_id bigint REFERENCES sqla_jobs_job (id))")
    try:
        conn.execute("INSERT INTO app_invoice VALUES (%s), (%s)", (ids[0], ids[3]))
        assert prune(conn, SQL, {"completed": DAY}, batch=2) == {"completed": 3, HISTORY: 0}
        assert sorted(r[0] for r in conn.execute("SELECT id FROM sqla_jobs_job")) == [
            ids[0],
            ids[3],
        ]
    finally:
        conn.execute("DROP TABLE app_invoice")


def test_a_claim_completes_while_a_prune_batch_holds_its_transaction_open(
    conn: Conn, migrated_url: str
) -> None:
    add(conn, 50, "dead", "8 days")
    add_history(conn, 50, "2 days")
    add(conn, 5, "pending", None)
    with psycopg.connect(libpq_conninfo(migrated_url)) as pruning:
        # One batch of each delete, its transaction left open: its row locks are all held.
        for compiled, params in (
            (SQL.prune_jobs, {"state": "dead", "skip": []}),
            (SQL.prune_history, {"outcome": "completed"}),
        ):
            pruning.execute(
                compiled.sql, compiled.params(older_than_us=86_400_000_000, limit=1000, **params)
            )
        conn.execute("SET lock_timeout = '2s'")
        claimed = conn.execute(
            WORKER_SQL.claim.sql,
            WORKER_SQL.claim.params(
                queue="default", limit=10, lease=timedelta(seconds=30), worker="w"
            ),
        ).fetchall()
        assert len(claimed) == 5
        ids = [r[0] for r in claimed]
        tokens = [r[10] for r in claimed]
        # Completing into history inserts beside the rows the prune is deleting.
        done = conn.execute(
            WORKER_SQL.complete_into_history.sql,
            WORKER_SQL.complete_into_history.params(ids=ids, token=tokens[0]),
        ).fetchall()
        assert sorted(r[0] for r in done) == sorted(ids)
        pruning.commit()
    assert left(conn) == {"history": 5}


def test_only_one_of_two_pruners_prunes_at_a_time(conn: Conn, migrated_url: str) -> None:
    add(conn, 3, "dead", "8 days")
    connector = Connector(libpq_conninfo(migrated_url), "t")
    retention = Retention()
    first = Pruner(connector=connector, schema=None, retention=retention, interval=60)
    second = Pruner(connector=connector, schema=None, retention=retention, interval=60)
    try:
        # The first holds the election lock (as while it runs): the second skips, never waits.
        lock = first._sql.try_lock
        holder = first._connection()
        assert holder.execute(lock.sql, lock.params(schema_name=None)).fetchone() == (True,)
        assert second.prune_once() is None
        assert second.skipped == 1
        assert left(conn) == {"dead": 3}
        holder.execute(first._sql.unlock.sql, first._sql.unlock.params(schema_name=None))
        # Released after the run: the next one prunes.
        ran = {
            "completed": 0,
            HISTORY: 0,
            "dead": 3,
            "cancelled": 0,
            OUTCOMES: 0,
            THROUGHPUT: 0,
            RATE_LIMITERS: 0,
            EDGES: 0,
        }
        assert second.prune_once() == ran
        assert first.prune_once() == {**ran, "dead": 0}
        # A run releases the lock it took: nobody holds it now.
        assert conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone() == (0,)
    finally:
        first._close()
        second._close()


def test_a_worker_prunes_on_its_schedule(conn: Conn, migrated_url: str) -> None:
    add(conn, 4, "dead", "8 days")
    add(conn, 2, "cancelled", "2 days")
    add(conn, 1, "dead", "1 day")
    jobs = Jobs()
    with running_workers(
        jobs, migrated_url, queues=["default"], prune_interval=0.05, poll_interval=0.05
    ) as (worker,):
        wait_until(lambda: left(conn) == {"dead": 1}, what="expired jobs pruned")
        assert worker.pruner is not None
        wait_until(lambda: worker.pruner is not None and worker.pruner.runs >= 2)


def test_a_worker_without_retention_has_no_pruner(conn: Conn, migrated_url: str) -> None:
    with running_workers(Jobs(), migrated_url, queues=["default"], retention=None) as (worker,):
        assert worker.pruner is None


def _explain_generic(c: Conn, query: str, params: dict[str, Any]) -> str:
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    c.execute(query, params, prepare=True)
    found = c.execute(
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'DELETE FROM%'"
    ).fetchone()
    assert found is not None
    c.execute("SET plan_cache_mode = force_generic_plan")
    args = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
    plan = c.execute(
        sql.SQL("EXPLAIN EXECUTE {}({})").format(sql.Identifier(found[0]), args)
    ).fetchall()
    return "\n".join(str(line[0]) for line in plan)


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("prune_jobs", "sqla_jobs_job_finished_idx"),
        ("prune_history", "sqla_jobs_history_finished_idx"),
    ],
)
def test_the_prune_uses_the_finished_index_in_a_generic_plan(
    conn: Conn, migrated_url: str, name: str, index: str
) -> None:
    # Many live rows a bad plan would scan: pending jobs, and recent history and dead jobs.
    add(conn, 20_000, "pending", None)
    add(conn, 5_000, "dead", "1 hour")
    add(conn, 100, "dead", "8 days")
    add_history(conn, 20_000, "1 hour")
    add_history(conn, 100, "2 days")
    conn.execute("ANALYZE sqla_jobs_job")
    conn.execute("ANALYZE sqla_jobs_history")
    compiled = getattr(SQL, name)
    extra = {"state": "dead", "skip": []} if name == "prune_jobs" else {"outcome": "completed"}
    # limit 0 while preparing: nothing is deleted.
    params = compiled.params(older_than_us=86_400_000_000, limit=0, **extra)
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as c:
        plan = _explain_generic(c, compiled.sql, params)
    assert "$1" in plan or "$2" in plan, f"not a generic plan:\n{plan}"
    assert index in plan, plan
    assert "Seq Scan" not in plan, plan
    assert "Sort" not in plan, plan
