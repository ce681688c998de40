"""Pruning a large history beside running claims: does the drain slow down, does the job table grow?

Each repetition drains the same pre-enqueued no-op jobs twice, each time in a fresh database whose
``sqla_jobs_history`` holds ``prune_history`` rows that finished two days ago (filled with one
``INSERT ... SELECT generate_series``): once alone, once while ``sqla-jobs prune --older-than 1d
--state completed`` runs in a process of its own (the pruner's code: 1,000-row batches, each its
own transaction, resting after each as the pruner does); the drain starts once it is deleting. The order
alternates between repetitions. Reported: the drain's rate with the prune over without it, the
prune's rows per second, and the job table's total size after each drain.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from .app import prefill
from .dbs import connect, fresh_database, wait_empty
from .figures import Outcome, Row, Series, Target
from .procs import Children
from .settings import Context

CONCURRENCY = 4
#: The drain here is this many times the drain measurement's: long enough (seconds, not a fraction
#: of one) to run beside a steady prune rather than beside its first batches.
DRAIN_FACTOR = 5


def fill_history(url: str, rows: int) -> None:
    """``rows`` history rows that finished two days ago, and the statistics a live table has."""
    with connect(url) as conn:
        conn.execute(
            "INSERT INTO sqla_jobs_history (id, queue, kind, payload, attempts, crashes, "
            "created_at, finished_at, steps, meta) "
            "SELECT g, 'default', 'ping', jsonb_build_object('n', g), 1, 0, "
            "now() - interval '3 days', now() - interval '2 days' + g * interval '1 ms', "
            "NULL, NULL FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE sqla_jobs_history")


def wait_pruning(conn: Any, rows: int, timeout: float = 60.0) -> None:
    """Until the history holds fewer than ``rows`` rows (the prune has begun deleting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = conn.execute("SELECT count(*) FROM sqla_jobs_history").fetchone()[0]
        if left < rows:
            return
        time.sleep(0.02)  # polling the effect, not a wait for time to pass
    raise RuntimeError("the prune never started deleting")


def job_table_bytes(conn: Any) -> int:
    row = conn.execute("SELECT pg_total_relation_size('sqla_jobs_job')").fetchone()
    return int(row[0])


def once(ctx: Context, with_prune: bool) -> dict[str, float]:
    sizes = ctx.sizes
    with fresh_database(ctx.server_url, "sqla_jobs") as url:
        fill_history(url, sizes.prune_history)
        jobs = sizes.drain_jobs * DRAIN_FACTOR
        prefill("sqla_jobs", url, jobs)
        with Children() as children, connect(url) as conn:
            conn.execute("VACUUM ANALYZE sqla_jobs_job")
            before = job_table_bytes(conn)
            proc = children.spawn(
                "worker", "--impl", "sqla", "--url", url, "--loops", str(CONCURRENCY)
            )
            proc.wait_ready()
            pruned: dict[str, Any] = {}
            command = [sys.executable, "-m", "sqla_jobs.cli", "prune", "--older-than", "1d"]
            command += ["--state", "completed", "--database-url", url]
            env = {k: v for k, v in os.environ.items() if not k.startswith("SQLA_JOBS_")}
            pruner = None
            p0 = time.perf_counter()
            if with_prune:
                # The drain starts once the prune is deleting, not while its process starts up:
                # what is measured is a steady prune beside the claims.
                pruner = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
                wait_pruning(conn, sizes.prune_history)
            t0 = time.perf_counter()
            proc.go()
            t1 = wait_empty(conn, "sqla_jobs_job", timeout=max(120.0, jobs / 100))
            result = proc.finish()
            if pruner is not None:
                out, _ = pruner.communicate(timeout=600)
                pruned["seconds"] = time.perf_counter() - p0
                # "pruned 0 completed jobs and N history rows finished more than 1d ago"
                pruned["rows"] = int(out.split(" and ")[1].split()[0])
            after = job_table_bytes(conn)
        if int(result["done"]) != jobs:
            raise RuntimeError(f"prune drain: {result['done']} of {jobs} done")
        if with_prune and pruned.get("rows") != sizes.prune_history:
            raise RuntimeError(f"pruned {pruned.get('rows')} of {sizes.prune_history} rows")
    return {
        "rate": jobs / (t1 - t0),
        "bytes_before": before,
        "bytes_after": after,
        "prune_rows_per_s": pruned["rows"] / pruned["seconds"] if with_prune else float("nan"),
        "prune_seconds": pruned.get("seconds", float("nan")),
    }


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    rates = {"prune": Series(), "alone": Series()}
    after = {"prune": Series(), "alone": Series()}
    before = Series()
    prune_rate = Series()
    prune_seconds = Series()
    for rep in range(ctx.repeat):
        order = ["alone", "prune"] if rep % 2 == 0 else ["prune", "alone"]
        for case in order:
            r = once(ctx, case == "prune")
            rates[case].add(r["rate"])
            after[case].add(r["bytes_after"] / 1024)
            before.add(r["bytes_before"] / 1024)
            if case == "prune":
                prune_rate.add(r["prune_rows_per_s"])
                prune_seconds.add(r["prune_seconds"])
            ctx.log(
                f"prune {case} rep {rep + 1}: drain {r['rate']:,.0f} jobs/s, job table "
                f"{r['bytes_before'] / 1024:,.0f} -> {r['bytes_after'] / 1024:,.0f} kB"
                + (
                    f", pruned {sizes.prune_history:,} rows at {r['prune_rows_per_s']:,.0f}/s "
                    f"in {r['prune_seconds']:.1f}s"
                    if case == "prune"
                    else ""
                )
            )
    history = f"{sizes.prune_history:,} history rows"
    label = f"{sizes.drain_jobs * DRAIN_FACTOR:,} jobs, concurrency {CONCURRENCY}"
    out = Outcome()
    out.rows = [
        Row(
            "prune",
            f"drain ({label}) while pruning {history} vs alone",
            "jobs/s",
            rates["prune"],
            rates["alone"],
            "drain alone",
            Target("ratio_min", 0.9),
        ),
        Row(
            "prune",
            f"prune of {history} (1,000 per batch) beside the drain",
            "rows/s",
            prune_rate,
            note="sqla-jobs prune in its own process, at the pruner's pace (it rests 9x each batch)",
        ),
        Row(
            "prune",
            "job table total size after the drain, with the prune vs alone",
            "kB",
            after["prune"],
            after["alone"],
            "drain alone",
            Target("ratio_max", 1.1),
            note=f"before the drain: {before.median:,.0f} kB",
        ),
    ]
    out.raw = {
        "rate": {k: v.as_dict() for k, v in rates.items()},
        "job_table_kb_after": {k: v.as_dict() for k, v in after.items()},
        "job_table_kb_before": before.as_dict(),
        "prune_rows_per_s": prune_rate.as_dict(),
        "prune_seconds": prune_seconds.as_dict(),
    }
    return out
