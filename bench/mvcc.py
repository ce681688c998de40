"""MVCC cost: row versions, WAL bytes and dead tuples per job, for enqueue plus drain.

Both sides enqueue in transactions of 1,000 jobs (sqla-jobs through ``enqueue_many``, the baseline
through the doc's INSERT, pipelined) and drain with four workers. WAL is counted for this database
only when ``pg_walinspect`` is available (other databases on the server write WAL too); otherwise
the server-wide LSN difference is used and the row says so.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from sqla_jobs.db.urls import libpq_conninfo

from . import baseline
from .app import KIND, Ping, make_engine, make_jobs, payload_dict
from .dbs import (
    TABLE,
    connect,
    fresh_database,
    settled_stats,
    wait_empty,
    wal_bytes,
    wal_lsn,
    wal_of_database,
)
from .drain import IMPLS
from .figures import Outcome, Row, Series, Target
from .procs import Children
from .settings import Context

CHUNK = 1_000
LOOPS = 4


def _enqueue(impl: str, url: str, n: int) -> None:
    if impl == "sqla":
        jobs = make_jobs()
        engine = make_engine(url)
        try:
            for start in range(0, n, CHUNK):
                with Session(engine) as s, s.begin():
                    jobs.enqueue_many(s, [Ping(n=i) for i in range(start, min(n, start + CHUNK))])
        finally:
            engine.dispose()
        return
    import psycopg

    with psycopg.connect(libpq_conninfo(url)) as conn:
        for start in range(0, n, CHUNK):
            baseline.insert_many(
                conn, KIND, [payload_dict(i) for i in range(start, min(n, start + CHUNK))]
            )


def mvcc_once(ctx: Context, impl: str, n: int) -> dict[str, Any]:
    subject = IMPLS[impl]
    table = TABLE[subject]
    with fresh_database(ctx.server_url, subject, walinspect=True) as url, connect(url) as conn:
        lsn0 = wal_lsn(conn)
        _enqueue(impl, url, n)
        lsn1 = wal_lsn(conn)
        with Children() as children:
            child = children.spawn("worker", "--impl", impl, "--url", url, "--loops", str(LOOPS))
            child.wait_ready()
            child.go()
            wait_empty(conn, table, timeout=max(120.0, n / 100))
            child.finish()
        lsn2 = wal_lsn(conn)
        stats = settled_stats(conn, table, deletes=n)
        db_enqueue = wal_of_database(conn, lsn0, lsn1)
        db_total = wal_of_database(conn, lsn0, lsn2)
        server_total = wal_bytes(conn, lsn0, lsn2)
    return {
        "row_versions_per_job": stats.row_versions / n,
        "hot_updates_per_job": stats.n_tup_hot_upd / n,
        "dead_tuples_after": stats.n_dead_tup,
        "dead_per_job": stats.n_dead_tup / n,
        # Without full-page images: those depend on when the server last checkpointed (any DROP
        # DATABASE on the server forces one), not on the queue.
        "wal_per_job": (db_total.without_fpi if db_total else server_total) / n,
        "wal_with_fpi_per_job": (db_total.total if db_total else server_total) / n,
        "wal_enqueue_per_job": None if db_enqueue is None else db_enqueue.without_fpi / n,
        "wal_server_per_job": server_total / n,
        "wal_scope": "database, without full-page images" if db_total else "server",
        "table_bytes": stats.table_bytes,
        "index_bytes": stats.index_bytes,
        "stats": stats.__dict__,
    }


def run(ctx: Context) -> Outcome:
    n = ctx.sizes.mvcc_jobs
    keys = (
        "row_versions_per_job",
        "wal_per_job",
        "wal_with_fpi_per_job",
        "dead_per_job",
        "hot_updates_per_job",
    )
    series = {impl: {k: Series() for k in keys} for impl in IMPLS}
    raw: dict[str, list[dict[str, Any]]] = {impl: [] for impl in IMPLS}
    impls = list(IMPLS)
    for rep in range(ctx.repeat):
        for impl in impls[rep % 3 :] + impls[: rep % 3]:
            r = mvcc_once(ctx, impl, n)
            for k in keys:
                series[impl][k].add(r[k])
            raw[impl].append(r)
            ctx.log(
                f"mvcc {impl} rep {rep + 1}: {r['row_versions_per_job']:.2f} row versions/job, "
                f"{r['wal_per_job']:,.0f} WAL bytes/job ({r['wal_scope']}; "
                f"{r['wal_with_fpi_per_job']:,.0f} with them), "
                f"{r['dead_tuples_after']} dead tuples after"
            )
    scope = raw["sqla"][0]["wal_scope"] if raw["sqla"] else "?"
    what = f"{n:,} jobs enqueued (1,000 per txn) and drained by {LOOPS} workers"
    s, single, batched = series["sqla"], series["single"], series["batched"]
    rows = [
        Row("mvcc", f"row versions per job (ins+upd+del), {what}", "versions/job",
            s["row_versions_per_job"], single["row_versions_per_job"], "doc baseline",
            Target("abs_max", 3.0)),
        Row("mvcc", "WAL bytes per job, enqueue + drain, vs single claim", "bytes/job",
            s["wal_per_job"], single["wal_per_job"], "single claim", Target("ratio_max", 1.2),
            note=f"WAL counted per {scope}"),
        Row("mvcc", "WAL bytes per job, enqueue + drain, vs batched claim", "bytes/job",
            s["wal_per_job"], batched["wal_per_job"], "batched claim", Target("ratio_max", 1.2),
            note=f"WAL counted per {scope}"),
        Row("mvcc", "WAL bytes per job incl. full-page images, vs single claim", "bytes/job",
            s["wal_with_fpi_per_job"], single["wal_with_fpi_per_job"], "single claim",
            note="full-page images depend on checkpoint timing (noisy)"),
        Row("mvcc", "dead tuples left per job after the drain (no vacuum)", "tuples/job",
            s["dead_per_job"], single["dead_per_job"], "single claim"),
        Row("mvcc", "HOT updates per job", "updates/job",
            s["hot_updates_per_job"], single["hot_updates_per_job"], "single claim"),
    ]  # fmt: skip
    return Outcome(rows, raw)
