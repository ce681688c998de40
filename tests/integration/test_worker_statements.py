"""The worker's statements, run by hand exactly as the worker runs them (compiled by ``WorkerSQL``,
executed by psycopg): the claim, its index, the lease fence, the reaper's crash accounting.

Time is injected, never waited for: a lease "expires" because the test moves ``lease_expires_at``
into the past.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from sqlalchemy import Engine

from sqla_jobs import Backoff
from sqla_jobs.context import ClaimedJob
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql import claim as claim_sql
from sqla_jobs.sql.compiled import WorkerSQL

SQL = WorkerSQL(None)
LEASE = timedelta(seconds=30)

Conn = psycopg.Connection[dict[str, Any]]


@pytest.fixture
def conn(clean: Engine, migrated_url: str) -> Iterator[Conn]:
    """An autocommit psycopg connection on the emptied queue table, as the worker has."""
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True, row_factory=dict_row) as c:
        yield c


def connect(url: str, **kwargs: Any) -> Conn:
    return psycopg.connect(libpq_conninfo(url), row_factory=dict_row, **kwargs)


def add_jobs(conn: Conn, n: int, **columns: Any) -> list[int]:
    """Insert ``n`` pending jobs with the same ``columns``; return their ids in order."""
    names = ["kind", "payload", *columns]
    values = ["'noop'", "'{}'::jsonb", *(f"%({c})s" for c in columns)]
    return [
        r["id"]
        for r in conn.execute(
            f"INSERT INTO sqla_jobs_job ({', '.join(names)}) "
            f"SELECT {', '.join(values)} FROM generate_series(1, {n}) RETURNING id",
            columns,
        ).fetchall()
    ]


def claim(
    conn: Conn, limit: int, worker: str = "w", queue: str = "default"
) -> list[dict[str, Any]]:
    cur = conn.execute(
        SQL.claim.sql, SQL.claim.params(queue=queue, limit=limit, lease=LEASE, worker=worker)
    )
    return cur.fetchall()


def row(conn: Conn, job_id: int) -> dict[str, Any]:
    found = conn.execute(
        "SELECT *, extract(epoch FROM lease_expires_at - now())::float AS lease_left, "
        "extract(epoch FROM run_at - now())::float AS due_in FROM sqla_jobs_job WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return found


def stored(conn: Conn, job_id: int, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's stored columns (``snapshot`` if given), without the ones computed from now()."""
    found = row(conn, job_id) if snapshot is None else snapshot
    return {k: v for k, v in found.items() if k not in ("lease_left", "due_in")}


def expire(conn: Conn, job_id: int) -> None:
    """Inject time: the job's lease ran out a second ago."""
    conn.execute(
        "UPDATE sqla_jobs_job SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
        (job_id,),
    )


def reap(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(SQL.reap.sql, SQL.reap.params(limit=100)).fetchall()


# -- the claim ---------------------------------------------------------------------------------------


def test_one_claim_statement_marks_up_to_limit_rows_running_under_a_fresh_lease(
    conn: Conn,
) -> None:
    ids = add_jobs(conn, 20, attempts=2)
    assert SQL.claim.sql.count("UPDATE sqla_jobs_job SET") == 1
    assert ";" not in SQL.claim.sql
    cur = conn.execute(
        SQL.claim.sql, SQL.claim.params(queue="default", limit=5, lease=LEASE, worker="w1")
    )
    claimed = cur.fetchall()
    assert cur.rowcount == 5
    assert [c["id"] for c in claimed] == ids[:5]
    assert all(c["attempts"] == 3 for c in claimed), "the claim counts the attempt"
    assert len({c["lease_token"] for c in claimed}) == 1, "one token per claim"
    again = conn.execute(
        SQL.claim.sql, SQL.claim.params(queue="default", limit=5, lease=LEASE, worker="w1")
    ).fetchall()
    assert len(again) == 5
    assert {c["lease_token"] for c in again}.isdisjoint({c["lease_token"] for c in claimed})
    for c in claimed:
        r = row(conn, c["id"])
        assert (r["state"], r["attempts"], r["locked_by"]) == ("running", 3, "w1")
        assert r["lease_token"] == c["lease_token"]
        assert 29 < r["lease_left"] <= 30, "the lease runs from the database's now()"
    states = conn.execute(
        "SELECT state, attempts, count(*) AS n FROM sqla_jobs_job GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert [tuple(s.values()) for s in states] == [("pending", 2, 10), ("running", 3, 10)]


def test_claim_takes_priority_then_run_at_then_id_and_skips_future_and_other_queues(
    conn: Conn,
) -> None:
    (later,) = add_jobs(conn, 1, priority=5)
    (urgent,) = add_jobs(conn, 1, priority=-5)
    inserted = conn.execute(
        "INSERT INTO sqla_jobs_job (kind, payload, priority, run_at) "
        "VALUES ('noop', '{}', 5, now() - interval '1 hour') RETURNING id"
    ).fetchone()
    assert inserted is not None
    older = inserted["id"]
    add_jobs(conn, 1, queue="elsewhere")
    conn.execute(
        "INSERT INTO sqla_jobs_job (kind, payload, run_at) "
        "VALUES ('noop', '{}', now() + interval '1 hour')"
    )
    assert [c["id"] for c in claim(conn, 10)] == [urgent, older, later]
    assert claim(conn, 10) == []


def test_a_second_claim_skips_rows_an_open_claim_holds_instead_of_waiting(
    conn: Conn, migrated_url: str
) -> None:
    ids = add_jobs(conn, 20)
    with connect(migrated_url) as first, connect(migrated_url, autocommit=True) as second:
        first_rows = claim(first, 5, worker="first")  # its transaction stays open: rows locked
        # Waiting on a row lock would fail within 200 ms; SKIP LOCKED never waits.
        second.execute("SET lock_timeout = '200ms'")
        second.execute("SET statement_timeout = '2s'")
        second_rows = claim(second, 5, worker="second")
        third_rows = claim(second, 100, worker="second")
        first.commit()
    a = {r["id"] for r in first_rows}
    b = {r["id"] for r in second_rows}
    c = {r["id"] for r in third_rows}
    assert (len(a), len(b), len(c)) == (5, 5, 10)
    assert not a & b
    assert not a & c
    assert not b & c
    assert a | b | c == set(ids)
    owners = conn.execute(
        "SELECT locked_by, count(*) AS n FROM sqla_jobs_job GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [tuple(o.values()) for o in owners] == [("first", 5), ("second", 15)]


def _explain_prepared(conn: Conn, name: str, args: sql.Composable, mode: str) -> str:
    conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.SQL(mode)))
    plan = conn.execute(
        sql.SQL("EXPLAIN EXECUTE {}({})").format(sql.Identifier(name), args)
    ).fetchall()
    return "\n".join(str(next(iter(line.values()))) for line in plan)


@pytest.mark.parametrize(("pending", "limit"), [(100, 5), (100, 260), (20_000, 260)])
def test_claim_uses_the_partial_claim_index_in_custom_and_generic_plans(
    conn: Conn, migrated_url: str, pending: int, limit: int
) -> None:
    # 260: a busy worker's claim (4 slots and the automatic prefetch's 256), from a backlog. The
    # claim once joined against a CTE, which there the planner hashed against a scan of the table.
    # History that a bad plan would wade through: 50,000 running and dead rows, 100 pending.
    conn.execute(
        "INSERT INTO sqla_jobs_job "
        "(kind, payload, state, lease_token, lease_expires_at, locked_by, run_at) "
        "SELECT 'noop', '{}', CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'running' END, "
        "CASE WHEN g % 2 = 1 THEN gen_random_uuid() END, "
        "CASE WHEN g % 2 = 1 THEN now() + interval '1 hour' END, "
        "CASE WHEN g % 2 = 1 THEN 'busy' END, now() - interval '1 day' "
        "FROM generate_series(1, 50000) g"
    )
    add_jobs(conn, pending)
    conn.execute("ANALYZE sqla_jobs_job")
    params = SQL.claim.params(queue="default", limit=limit, lease=LEASE, worker="planner")
    # psycopg numbers the placeholders in order of first appearance: bind them the same way.
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", SQL.claim.sql)))
    args = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
    with connect(migrated_url, autocommit=True) as c:
        # The statement exactly as the worker runs it, prepared server-side as psycopg does (with
        # limit 0, so preparing it claims nothing; psycopg forgets statements on rollback).
        c.execute(SQL.claim.sql, {**params, "limit": 0}, prepare=True)
        prepared = c.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'WITH claimed AS%'"
        ).fetchall()
        assert len(prepared) == 1
        name = prepared[0]["name"]
        custom = _explain_prepared(c, name, args, "force_custom_plan")
        generic = _explain_prepared(c, name, args, "force_generic_plan")
    # A custom plan has the queue's value in its index condition, a generic one a parameter.
    assert "'default'::text" not in generic, "not a generic plan"
    assert "'default'::text" in custom, "not a custom plan"
    for plan in (custom, generic):
        assert "sqla_jobs_job_claim_idx" in plan, plan
        # The claimed rows are fetched by primary key, not found by scanning or hashing.
        assert "Index Scan using sqla_jobs_job_pkey" in plan, plan
        assert "Seq Scan on sqla_jobs_job" not in plan, plan
        assert "Hash" not in plan, plan
        # The index order serves the selection's ORDER BY: the one sort is of the claimed rows
        # (into claim order, for the worker), not of the candidates.
        assert plan.count("Sort Key") == 1, plan
        assert "Sort Key: claimed.priority" in plan, plan


# -- the lease fence ----------------------------------------------------------------------------------


def test_a_stale_worker_can_no_longer_write_once_its_job_is_reclaimed(conn: Conn) -> None:
    (job_id,) = add_jobs(conn, 1)
    (old,) = claim(conn, 1, worker="stale")
    expire(conn, job_id)
    assert [r["id"] for r in reap(conn)] == [job_id]
    (new,) = claim(conn, 1, worker="fresh")
    assert new["lease_token"] != old["lease_token"]
    owned = row(conn, job_id)

    stale = {"ids": [job_id], "tokens": [old["lease_token"]]}
    writes = {
        "complete": SQL.complete.params(ids=[job_id], token=old["lease_token"]),
        "complete_into_history": SQL.complete_into_history.params(
            ids=[job_id], token=old["lease_token"]
        ),
        "heartbeat": SQL.heartbeat.params(**stale, lease=timedelta(hours=1)),
        "release": SQL.release.params(**stale),
        "fail": SQL.fail.params(
            id=job_id,
            token=old["lease_token"],
            error="stale",
            force_dead=True,
            error_class="RuntimeError",
            message="stale",
            traceback=None,
            **Backoff().sql_params(),
        ),
        "record_step": SQL.record_step.params(
            id=job_id, token=old["lease_token"], name="s", value="1"
        ),
    }
    for name, params in writes.items():
        cur = conn.execute(getattr(SQL, name).sql, params)
        assert cur.rowcount == 0, f"{name} with the old token changed the row"
    assert stored(conn, job_id) == stored(conn, job_id, owned)
    assert (owned["state"], owned["locked_by"], owned["attempts"], owned["crashes"]) == (
        "running",
        "fresh",
        2,
        1,
    )
    assert conn.execute("SELECT count(*) AS n FROM sqla_jobs_history").fetchone() == {"n": 0}
    cur = conn.execute(
        SQL.complete.sql, SQL.complete.params(ids=[job_id], token=new["lease_token"])
    )
    assert cur.rowcount == 1, "the owner's token still works"


def test_heartbeat_extends_only_the_leases_still_held(conn: Conn) -> None:
    kept_id, lost_id = add_jobs(conn, 2)
    kept, lost = claim(conn, 2)
    conn.execute(
        "UPDATE sqla_jobs_job SET lease_token = gen_random_uuid() WHERE id = %s", (lost_id,)
    )
    rows = conn.execute(
        SQL.heartbeat.sql,
        SQL.heartbeat.params(
            ids=[kept_id, lost_id],
            tokens=[kept["lease_token"], lost["lease_token"]],
            lease=timedelta(hours=1),
        ),
    ).fetchall()
    assert [r["id"] for r in rows] == [kept_id]
    assert row(conn, kept_id)["lease_left"] > 3500
    assert row(conn, lost_id)["lease_left"] < 31


def test_release_returns_the_job_to_its_place_with_the_attempt_undone(conn: Conn) -> None:
    (job_id,) = add_jobs(conn, 1, attempts=1)
    before = row(conn, job_id)
    (claimed,) = claim(conn, 1)
    cur = conn.execute(
        SQL.release.sql, SQL.release.params(ids=[job_id], tokens=[claimed["lease_token"]])
    )
    assert cur.rowcount == 1
    after = row(conn, job_id)
    assert (after["state"], after["attempts"], after["crashes"]) == ("pending", 1, 0)
    assert (after["lease_token"], after["lease_expires_at"], after["locked_by"]) == (None,) * 3
    assert after["run_at"] == before["run_at"]
    assert after["last_error"] is None


# -- crash accounting ----------------------------------------------------------------------------------


def test_reaped_leases_count_crashes_not_failures_until_the_crash_budget_is_spent(
    conn: Conn,
) -> None:
    (job_id,) = add_jobs(conn, 1, max_crashes=3, max_attempts=1)
    for n in (1, 2, 3):
        assert len(claim(conn, 1, worker=f"victim-{n}")) == 1
        expire(conn, job_id)
        (reaped,) = reap(conn)
        assert (reaped["id"], reaped["crashes"], reaped["locked_by"]) == (job_id, n, f"victim-{n}")
        r = row(conn, job_id)
        assert (r["attempts"], r["crashes"]) == (n, n), "every crash is also a claim, no failure"
        assert r["last_error"] == f"lease expired: worker victim-{n} stopped heartbeating"
        assert (r["lease_token"], r["locked_by"]) == (None, None)
        if n < 3:
            # max_attempts=1 would make a single failure fatal: crashes must not spend it.
            assert r["state"] == "pending"
            assert -1 < r["due_in"] <= 0, "due again at once"
        else:
            assert r["state"] == "dead"
    assert claim(conn, 1) == [], "a dead job is never claimed"


def test_a_failure_after_a_crash_backs_off_as_the_first_failure(conn: Conn) -> None:
    backoff = Backoff(base=3, cap_seconds=100, jitter=0)
    (job_id,) = add_jobs(conn, 1, max_attempts=2)
    claim(conn, 1)
    expire(conn, job_id)
    reap(conn)
    (claimed,) = claim(conn, 1)
    assert (claimed["attempts"], claimed["crashes"]) == (2, 1)
    (failed,) = conn.execute(
        SQL.fail.sql,
        SQL.fail.params(
            id=job_id,
            token=claimed["lease_token"],
            error="boom",
            force_dead=False,
            error_class="RuntimeError",
            message="boom",
            traceback=None,
            **backoff.sql_params(),
        ),
    ).fetchall()
    r = row(conn, job_id)
    assert failed["state"] == "pending" == r["state"], "one failure of a budget of two"
    assert backoff.delay(1) - 1 < r["due_in"] <= backoff.delay(1), "delay(failures=1), not (2)"


def test_reaping_leaves_live_leases_alone(conn: Conn) -> None:
    live_id, dead_id = add_jobs(conn, 2)
    claim(conn, 2)
    expire(conn, dead_id)
    assert [r["id"] for r in reap(conn)] == [dead_id]
    assert row(conn, live_id)["state"] == "running"


def test_claim_returns_the_columns_in_the_order_the_worker_unpacks_them() -> None:
    for stmt in (claim_sql.claim(), claim_sql.claim_keyed()):
        assert [c.name for c in stmt.selected_columns] == list(ClaimedJob._fields)


# -- the fence pairs ids with tokens; a row lock delays only its own renewal -----------------------


def test_the_fence_matches_id_token_pairs_not_two_sets(conn: Conn) -> None:
    """Two claims of one worker: one claim's id with the other claim's token matches nothing."""
    a_id, b_id = add_jobs(conn, 2)
    (a,) = claim(conn, 1)
    (b,) = claim(conn, 1)
    crossed = {"ids": [a_id, b_id], "tokens": [b["lease_token"], a["lease_token"]]}
    for name in ("heartbeat", "release"):
        params = getattr(SQL, name).params(**crossed, lease=timedelta(hours=1))
        cur = conn.execute(getattr(SQL, name).sql, params)
        assert cur.rowcount == 0, f"{name} paired one claim's id with another claim's token"
    # A completion is per claim: a's id under b's claim token deletes nothing.
    for name in ("complete", "complete_into_history"):
        params = getattr(SQL, name).params(ids=[a_id], token=b["lease_token"])
        assert conn.execute(getattr(SQL, name).sql, params).rowcount == 0, name
    paired = {"ids": [a_id, b_id], "tokens": [a["lease_token"], b["lease_token"]]}
    assert conn.execute(SQL.release.sql, SQL.release.params(**paired)).rowcount == 2


def test_heartbeat_skips_a_row_locked_by_another_session_and_renews_the_others(
    conn: Conn, migrated_url: str
) -> None:
    locked_id, free_id = add_jobs(conn, 2)
    locked, free = claim(conn, 2)
    held = {
        "ids": [locked_id, free_id],
        "tokens": [locked["lease_token"], free["lease_token"]],
    }
    with connect(migrated_url) as operator:
        operator.execute("SELECT id FROM sqla_jobs_job WHERE id = %s FOR UPDATE", (locked_id,))
        conn.execute("SET lock_timeout = '5s'")  # a wait would fail the test, not hang it
        rows = conn.execute(
            SQL.heartbeat.sql, SQL.heartbeat.params(**held, lease=timedelta(hours=1))
        ).fetchall()
        assert [r["id"] for r in rows] == [free_id], "the renewal waited for, or took, the lock"
        # Lost or locked? A plain read says: still ours.
        still = conn.execute(SQL.held_leases.sql, SQL.held_leases.params(**held)).fetchall()
        assert sorted(r["id"] for r in still) == sorted([locked_id, free_id])
        operator.rollback()
    assert row(conn, free_id)["lease_left"] > 3500
    assert row(conn, locked_id)["lease_left"] < 31


def test_release_of_started_jobs_counts_an_interruption_not_an_attempt(conn: Conn) -> None:
    (job_id,) = add_jobs(conn, 1)
    (claimed,) = claim(conn, 1)
    conn.execute(
        SQL.release.sql,
        SQL.release.params(ids=[job_id], tokens=[claimed["lease_token"]], interrupted=True),
    )
    after = row(conn, job_id)
    assert (after["state"], after["attempts"], after["crashes"], after["interruptions"]) == (
        "pending",
        0,
        0,
        1,
    )


def test_keep_completed_leaves_the_row_terminal_and_out_of_every_claim(conn: Conn) -> None:
    (job_id,) = add_jobs(conn, 1)
    (claimed,) = claim(conn, 1)
    conn.execute(
        SQL.keep_completed.sql,
        SQL.keep_completed.params(id=job_id, token=claimed["lease_token"], error="fk"),
    )
    after = row(conn, job_id)
    assert (after["state"], after["last_error"], after["lease_token"]) == ("completed", "fk", None)
    assert claim(conn, 10) == []
    expire(conn, job_id)
    assert reap(conn) == []


@pytest.mark.parametrize(
    ("crashed_ok", "last_life_ok", "expected"),
    [
        (True, True, {"fresh", "crashed", "last_life"}),
        (True, False, {"fresh", "crashed"}),  # holds a crashed job: no last-life job with it
        (False, False, {"fresh"}),  # holds a last-life job: no other crashed job with it
    ],
)
def test_the_claim_keeps_a_job_on_its_last_crash_life_apart_from_other_crashed_jobs(
    conn: Conn, crashed_ok: bool, last_life_ok: bool, expected: set[str]
) -> None:
    names = {}
    for name, crashes in (("fresh", 0), ("crashed", 1), ("last_life", 2)):
        (job_id,) = add_jobs(conn, 1, crashes=crashes, attempts=crashes, max_crashes=3)
        names[job_id] = name
    rows = conn.execute(
        SQL.claim.sql,
        SQL.claim.params(
            queue="default",
            limit=10,
            lease=LEASE,
            worker="w",
            crashed_ok=crashed_ok,
            last_life_ok=last_life_ok,
        ),
    ).fetchall()
    assert {names[r["id"]] for r in rows} == expected
