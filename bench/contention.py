"""Contention: K workers claiming with ``FOR UPDATE`` and no ``SKIP LOCKED``, against with it.

The doc's single claim on the baseline table, K threads each on its own connection, for a fixed
time. Time blocked on locks is sampled from ``pg_stat_activity`` (``wait_event_type = 'Lock'``)
every 10 ms, and each claim's round trip is timed on the client.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from sqla_jobs.db.urls import libpq_conninfo

from . import baseline
from .app import prefill
from .dbs import connect, fresh_database
from .figures import Outcome, Row, Series, percentile
from .settings import Context

SAMPLE_EVERY = 0.01


def _claimer(
    conninfo: str, sql: str, deadline: float, out: dict[str, Any], ready: threading.Barrier
) -> None:
    claims = empty = 0
    waits: list[float] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        ready.wait()
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            row = conn.execute(sql).fetchone()
            waits.append(time.perf_counter() - t)
            if row is None:
                empty += 1
                continue
            conn.execute(baseline.COMPLETE_ONE, (row[0],))
            claims += 1
    out.update(claims=claims, empty=empty, claim_seconds=waits)


def race(url: str, workers: int, skip_locked: bool, seconds: float) -> dict[str, Any]:
    """``workers`` threads claiming from the baseline's filled ``jobs`` table at ``url`` for
    ``seconds``, each on its own connection; what they did, and how long they spent blocked.

    Shared with the demo's last step, which runs it in its own database."""
    sql = baseline.CLAIM_ONE if skip_locked else baseline.CLAIM_ONE_NO_SKIP
    with connect(url) as monitor:
        conninfo = libpq_conninfo(url)
        ready = threading.Barrier(workers + 1)
        results: list[dict[str, Any]] = [{} for _ in range(workers)]
        start = time.perf_counter() + 0.2
        deadline = start + seconds
        threads = [
            threading.Thread(target=_claimer, args=(conninfo, sql, deadline, results[i], ready))
            for i in range(workers)
        ]
        for t in threads:
            t.start()
        ready.wait()
        samples = blocked = active = 0
        while time.perf_counter() < deadline:
            row = monitor.execute(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), "
                "count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'"
            ).fetchone()
            assert row is not None
            samples += 1
            blocked += int(row[0])
            active += int(row[1])
            time.sleep(SAMPLE_EVERY)
        for t in threads:
            t.join()
    claims = sum(r["claims"] for r in results)
    waits = [w * 1000 for r in results for w in r["claim_seconds"]]
    blocked_share = blocked / (samples * workers) if samples else float("nan")
    return {
        "claims_per_s": claims / seconds,
        "empty_claims": sum(r["empty"] for r in results),
        "blocked_share": blocked_share,
        "blocked_seconds": blocked_share * workers * seconds,
        "claim_ms_p50": percentile(waits, 50),
        "claim_ms_p99": percentile(waits, 99),
        "samples": samples,
    }


def contention_once(ctx: Context, workers: int, skip_locked: bool) -> dict[str, Any]:
    """One :func:`race` on a fresh database holding ``contention_jobs`` due jobs."""
    with fresh_database(ctx.server_url, "baseline") as url:
        prefill("baseline", url, ctx.sizes.contention_jobs)
        return race(url, workers, skip_locked, ctx.sizes.contention_seconds)


def run(ctx: Context) -> Outcome:
    out = Outcome()
    for workers in ctx.sizes.contention_workers:
        keys = ("claims_per_s", "blocked_seconds", "claim_ms_p99")
        series = {mode: {k: Series() for k in keys} for mode in (True, False)}
        raw: dict[str, list[dict[str, Any]]] = {"skip_locked": [], "for_update": []}
        out.raw[f"k{workers}"] = raw
        for rep in range(ctx.repeat):
            for skip in (True, False) if rep % 2 == 0 else (False, True):
                r = contention_once(ctx, workers, skip)
                for k in keys:
                    series[skip][k].add(r[k])
                raw["skip_locked" if skip else "for_update"].append(r)
                ctx.log(
                    f"contention K={workers} {'SKIP LOCKED' if skip else 'FOR UPDATE'} "
                    f"rep {rep + 1}: {r['claims_per_s']:,.0f} claims/s, blocked "
                    f"{r['blocked_share']:.0%} of worker time, {r['empty_claims']} empty claims"
                )
        what = f"K={workers} connections, {ctx.sizes.contention_seconds:g} s"
        out.rows += [
            Row("contention", f"claims/s, {what}: SKIP LOCKED vs plain FOR UPDATE", "claims/s",
                series[True]["claims_per_s"], series[False]["claims_per_s"], "FOR UPDATE",
                subject_label="SKIP LOCKED"),
            Row("contention", f"worker-seconds blocked on locks, {what}", "s",
                series[True]["blocked_seconds"], series[False]["blocked_seconds"], "FOR UPDATE",
                note="sampled from pg_stat_activity every 10 ms", subject_label="SKIP LOCKED"),
            Row("contention", f"claim round trip p99, {what}", "ms",
                series[True]["claim_ms_p99"], series[False]["claim_ms_p99"], "FOR UPDATE",
                subject_label="SKIP LOCKED"),
        ]  # fmt: skip
    return out
