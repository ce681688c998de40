"""``python -m bench.growth_sql``: what a claim costs when most of the queue is not claimable.

Creates a scratch database on the server (``--url``, else ``DATABASE_URL``, else an embedded
PostgreSQL for the duration), migrates it, loads 2M unkeyed jobs scheduled a day ahead (queue
``default``, priorities 0-3) and 200k keyed jobs due now over 1,000 keys (queue ``keyed``,
limit 2 each), then prints, for each statement, EXPLAIN (ANALYZE, BUFFERS) of the statements
the loose index scans replaced (kept below as text) beside today's: shared buffers touched, execution time,
and the median wall time of 20 runs as a worker sends them (psycopg, prepared after 5). It adds
20k due jobs to ``default`` and measures again. Every claim runs in a transaction rolled back,
so each run sees the same table. The database is dropped at the end. Figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg

from devdb import database_url
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql import claim as claim_sql
from sqla_jobs.sql import scans as scans_sql
from sqla_jobs.sql.compiled import Compiled, compile_statement

from .dbs import fresh_database

#: The claim statements as they were before the loose index scans (psycopg placeholders).
OLD_SQL = {
    "claim": """
WITH claimed AS
(UPDATE sqla_jobs_job SET state='running', attempts=(sqla_jobs_job.attempts +
%(attempts_1)s::INTEGER), lease_token=(SELECT gen_random_uuid() AS gen_random_uuid_1),
lease_expires_at=(now() + %(lease)s), locked_by=%(worker)s::VARCHAR WHERE sqla_jobs_job.id =
any(array((SELECT sqla_jobs_job.id
FROM sqla_jobs_job
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL AND
sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.run_at <= now() AND
(sqla_jobs_job.crashes = %(crashes_1)s::INTEGER OR %(crashed_ok)s AND sqla_jobs_job.crashes +
%(crashes_2)s::INTEGER < sqla_jobs_job.max_crashes OR %(last_life_ok)s) AND NOT (EXISTS (SELECT
1
FROM sqla_jobs_queue
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL))
ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id
LIMIT %(limit)s::BIGINT FOR UPDATE SKIP LOCKED))) RETURNING sqla_jobs_job.id,
sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.priority,
sqla_jobs_job.attempts, sqla_jobs_job.max_attempts, sqla_jobs_job.crashes,
sqla_jobs_job.max_crashes, sqla_jobs_job.interruptions, sqla_jobs_job.lease_token,
sqla_jobs_job.created_at, sqla_jobs_job.concurrency_key, sqla_jobs_job.steps,
sqla_jobs_job.run_at)
SELECT claimed.id, claimed.queue, claimed.kind, claimed.payload, claimed.priority,
claimed.attempts, claimed.max_attempts, claimed.crashes, claimed.max_crashes,
claimed.interruptions, claimed.lease_token, claimed.created_at, claimed.concurrency_key,
claimed.steps
FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id
""",
    "lock_keys": """
WITH heads AS MATERIALIZED
(SELECT sqla_jobs_job.concurrency_key AS concurrency_key, sqla_jobs_job.priority AS priority,
sqla_jobs_job.run_at AS run_at, sqla_jobs_job.id AS id, row_number() OVER (PARTITION BY
sqla_jobs_job.concurrency_key ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at,
sqla_jobs_job.id) AS rank
FROM sqla_jobs_job
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL AND
sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.run_at <= now() AND NOT (EXISTS
(SELECT 1
FROM sqla_jobs_queue
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL))),
candidates AS MATERIALIZED
(SELECT heads.concurrency_key AS concurrency_key
FROM heads
WHERE heads.rank = %(rank_1)s::INTEGER ORDER BY heads.priority, heads.run_at, heads.id
LIMIT %(scan)s::BIGINT)
SELECT candidates.concurrency_key
FROM candidates
WHERE pg_try_advisory_xact_lock(-1196525586, hashtext(candidates.concurrency_key))
""",
    "claim_keyed": """
WITH ranked AS MATERIALIZED
(SELECT sqla_jobs_job.id AS id, sqla_jobs_job.concurrency_key AS concurrency_key,
sqla_jobs_job.concurrency_limit AS concurrency_limit, sqla_jobs_job.priority AS priority,
sqla_jobs_job.run_at AS run_at, row_number() OVER (PARTITION BY sqla_jobs_job.concurrency_key
ORDER BY sqla_jobs_job.priority, sqla_jobs_job.run_at, sqla_jobs_job.id) AS rank
FROM sqla_jobs_job
WHERE sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key = any(%(keys)s::TEXT[])
AND sqla_jobs_job.queue = %(queue)s::VARCHAR AND sqla_jobs_job.run_at <= now() AND NOT (EXISTS
(SELECT 1
FROM sqla_jobs_queue
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL)) AND
(sqla_jobs_job.crashes = %(crashes_1)s::INTEGER OR %(crashed_ok)s AND sqla_jobs_job.crashes +
%(crashes_2)s::INTEGER < sqla_jobs_job.max_crashes OR %(last_life_ok)s)),
running AS MATERIALIZED
(SELECT sqla_jobs_job.concurrency_key AS concurrency_key, count(*) AS n
FROM sqla_jobs_job
WHERE sqla_jobs_job.state = 'running' AND sqla_jobs_job.concurrency_key = any(%(keys)s::TEXT[])
GROUP BY sqla_jobs_job.concurrency_key),
claimed AS
(UPDATE sqla_jobs_job SET state='running', attempts=(sqla_jobs_job.attempts +
%(attempts_1)s::INTEGER), lease_token=(SELECT gen_random_uuid() AS gen_random_uuid_1),
lease_expires_at=(now() + %(lease)s), locked_by=%(worker)s::VARCHAR WHERE sqla_jobs_job.id =
any(array((SELECT ranked.id
FROM ranked LEFT OUTER JOIN running ON running.concurrency_key = ranked.concurrency_key
WHERE ranked.rank <= ranked.concurrency_limit - coalesce(running.n, %(coalesce_1)s::INTEGER)
ORDER BY ranked.priority, ranked.run_at, ranked.id
LIMIT %(limit)s::BIGINT))) AND sqla_jobs_job.state = 'pending' RETURNING sqla_jobs_job.id,
sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.priority,
sqla_jobs_job.attempts, sqla_jobs_job.max_attempts, sqla_jobs_job.crashes,
sqla_jobs_job.max_crashes, sqla_jobs_job.interruptions, sqla_jobs_job.lease_token,
sqla_jobs_job.created_at, sqla_jobs_job.concurrency_key, sqla_jobs_job.steps,
sqla_jobs_job.run_at)
SELECT claimed.id, claimed.queue, claimed.kind, claimed.payload, claimed.priority,
claimed.attempts, claimed.max_attempts, claimed.crashes, claimed.max_crashes,
claimed.interruptions, claimed.lease_token, claimed.created_at, claimed.concurrency_key,
claimed.steps
FROM claimed ORDER BY claimed.priority, claimed.run_at, claimed.id
""",
}
OLD_DEFAULTS: dict[str, Any] = {
    "attempts_1": 1,
    "crashes_1": 0,
    "crashed_ok": True,
    "crashes_2": 1,
    "last_life_ok": True,
    "coalesce_1": 0,
    "rank_1": 1,
}
#: Queues of a worker that serves many, most of them empty (the idle poll).
POLLED_QUEUES = ["default", "keyed", *(f"empty{i}" for i in range(48))]
LOAD = [
    "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at)"
    " SELECT 'default', 'bench', '{}', i % 4, now() + interval '1 day' + i * interval '1 ms'"
    " FROM generate_series(1, 2000000) i",
    "INSERT INTO sqla_jobs_job"
    " (queue, kind, payload, priority, run_at, concurrency_key, concurrency_limit)"
    " SELECT 'keyed', 'bench', '{}', i % 4, now() - interval '1 hour' + i * interval '1 ms',"
    " 'key' || (i % 1000), 2 FROM generate_series(1, 200000) i",
]
ADD_DUE = (
    "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at)"
    " SELECT 'default', 'bench', '{}', i % 4, now() - interval '1 hour' + i * interval '1 ms'"
    " FROM generate_series(1, 20000) i"
)
RUNS = 20

Conn = psycopg.Connection[tuple[Any, ...]]
#: Buffers, execution ms (EXPLAIN ANALYZE), median wall ms.
Figures = tuple[int, float, float]


def _old(name: str) -> Compiled:
    return Compiled(sql=OLD_SQL[name], defaults=OLD_DEFAULTS)


#: The statements measured, by name.
_BUILDERS = {
    "claim": claim_sql.claim,
    "claim_keyed": claim_sql.claim_keyed,
    "lock_keys": scans_sql.lock_keys,
    "claimable_queues": scans_sql.claimable_queues,
}


def _new(name: str) -> Compiled:
    return compile_statement(_BUILDERS[name](), None)


def _claim_params(queue: str, limit: int) -> dict[str, Any]:
    return {
        "queue": queue,
        "limit": limit,
        "lease": timedelta(seconds=60),
        "worker": "bench",
        "monotonic": time.monotonic(),
    }


def _explain(conn: Conn, stmt: Compiled, params: dict[str, Any]) -> tuple[int, float]:
    """Shared buffers touched (hit + read, planning excluded) and execution time in ms."""
    row = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + stmt.sql, stmt.params(**params)
    ).fetchone()
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]
    top = plan["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"], plan["Execution Time"]


def _wall(run: Callable[[Conn], object], conn: Conn) -> float:
    """Median wall time in ms of ``run`` over RUNS rolled-back transactions."""
    times = []
    for _ in range(RUNS):
        with conn.transaction(force_rollback=True):
            start = time.perf_counter()
            run(conn)
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _settle(conn: Conn) -> None:
    # The rolled-back claims of the previous measurement leave dead row versions that the next
    # one would step over: each measurement starts from the same clean table.
    conn.execute("VACUUM sqla_jobs_job")


def _claim(conn: Conn, stmt: Compiled, queue: str, limit: int) -> Figures:
    _settle(conn)
    with conn.transaction(force_rollback=True):
        buffers, ms = _explain(conn, stmt, _claim_params(queue, limit))
    wall = _wall(lambda c: c.execute(stmt.sql, stmt.params(**_claim_params(queue, limit))), conn)
    return buffers, ms, wall


def _keyed(conn: Conn, lock: Compiled, claim: Compiled, limit: int) -> Figures:
    """lock_keys then claim_keyed, as a worker runs them: the two statements' sums."""
    params = _claim_params("keyed", limit)
    _settle(conn)
    with conn.transaction(force_rollback=True):
        lock_buffers, lock_ms = _explain(conn, lock, {"queue": "keyed", "scan": limit})
    with conn.transaction(force_rollback=True):
        keys = [r[0] for r in conn.execute(lock.sql, lock.params(queue="keyed", scan=limit))]
        claim_buffers, claim_ms = _explain(conn, claim, {**params, "keys": keys})

    def run(c: Conn) -> None:
        found = [r[0] for r in c.execute(lock.sql, lock.params(queue="keyed", scan=limit))]
        c.execute(claim.sql, claim.params(**params, keys=found)).fetchall()

    return lock_buffers + claim_buffers, lock_ms + claim_ms, _wall(run, conn)


def _poll_old(conn: Conn) -> Figures:
    """An idle worker's poll before: a claim and a lock_keys per queue (a worker with keyed kinds)."""
    claim, lock = _old("claim"), _old("lock_keys")
    buffers, ms = 0, 0.0
    with conn.transaction(force_rollback=True):
        for queue in POLLED_QUEUES:
            b, m = _explain(conn, claim, _claim_params(queue, 10))
            b2, m2 = _explain(conn, lock, {"queue": queue, "scan": 10})
            buffers, ms = buffers + b + b2, ms + m + m2

    def run(c: Conn) -> None:
        for queue in POLLED_QUEUES:
            c.execute(claim.sql, claim.params(**_claim_params(queue, 10))).fetchall()
            c.execute(lock.sql, lock.params(queue=queue, scan=10)).fetchall()

    return buffers, ms, _wall(run, conn)


def _poll_new(conn: Conn) -> Figures:
    """An idle worker's poll now: one probe for all its queues."""
    probe = _new("claimable_queues")
    params = {"queues": POLLED_QUEUES, "keyed": True}
    with conn.transaction(force_rollback=True):
        buffers, ms = _explain(conn, probe, params)
    return buffers, ms, _wall(lambda c: c.execute(probe.sql, probe.params(**params)), conn)


def _rows(conn: Conn, label: str) -> Iterator[tuple[str, Figures, Figures]]:
    for limit in (10, 100):
        yield (
            f"claim limit {limit}, {label}",
            _claim(conn, _old("claim"), "default", limit),
            _claim(conn, _new("claim"), "default", limit),
        )
    yield (
        "claim limit 10, empty queue",
        _claim(conn, _old("claim"), "empty0", 10),
        _claim(conn, _new("claim"), "empty0", 10),
    )
    yield (
        "keyed claim limit 10, 200k due / 1,000 keys",
        _keyed(conn, _old("lock_keys"), _old("claim_keyed"), 10),
        _keyed(conn, _new("lock_keys"), _new("claim_keyed"), 10),
    )
    yield (f"idle poll of {len(POLLED_QUEUES)} queues", _poll_old(conn), _poll_new(conn))


def _print(rows: Iterator[tuple[str, Figures, Figures]]) -> None:
    print(f"{'':48} {'buffers':>17} {'exec ms':>17} {'wall ms':>17}")
    print(f"{'':48} {'old':>8} {'new':>8} {'old':>8} {'new':>8} {'old':>8} {'new':>8}")
    for label, old, new in rows:
        print(
            f"{label:48} {old[0]:>8} {new[0]:>8} {old[1]:>8.2f} {new[1]:>8.2f}"
            f" {old[2]:>8.2f} {new[2]:>8.2f}",
            flush=True,
        )


def run(server_url: str) -> None:
    """Load, measure and print on a scratch database of ``server_url``; drop it."""
    with (
        fresh_database(server_url, "sqla_jobs") as url,
        psycopg.connect(libpq_conninfo(url), autocommit=True) as conn,
    ):
        version = conn.execute("SHOW server_version").fetchone()
        print(f"PostgreSQL {version[0] if version else '?'}")
        for sql in LOAD:
            conn.execute(sql)
        conn.execute("VACUUM ANALYZE sqla_jobs_job")
        print("2M jobs scheduled a day ahead, 0 due; 200k keyed due over 1,000 keys")
        _print(_rows(conn, "2M scheduled, 0 due"))
        conn.execute(ADD_DUE)
        conn.execute("VACUUM ANALYZE sqla_jobs_job")
        print("\nthe same plus 20k unkeyed jobs due")
        _print(_rows(conn, "2M scheduled, 20k due"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.growth_sql", description=__doc__)
    parser.add_argument("--url", help="server URL (default DATABASE_URL, else embedded)")
    args = parser.parse_args(argv)
    if args.url:
        run(args.url)
        return
    with database_url() as url:
        run(url)


if __name__ == "__main__":
    main()
