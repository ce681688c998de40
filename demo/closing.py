"""Steps 7 and 8: the queue's stats, and FOR UPDATE against FOR UPDATE SKIP LOCKED, measured.

The measurement is the benchmark's own (:func:`bench.contention.race`) on the benchmark's plain
queue table (:mod:`bench.baseline`), created in the demo's database for the step and dropped after
it, so the demo and ``nox -s bench`` show the same thing measured the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import sql
from sqlalchemy import func, select

from bench import baseline
from bench.app import prefill
from bench.contention import race
from bench.dbs import connect
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.model import JobHistory
from sqla_jobs.observe.stats import collect, render

from .tour import Demo

#: The race: connections claiming at once, seconds per variant, jobs in the table at its start
#: (more than the faster variant can claim in that time, so neither runs dry).
RACE_CONNECTIONS = 4
RACE_SECONDS = 2.0
RACE_JOBS = 40_000


def stats(demo: Demo) -> None:
    """Step 7: ``sqla-jobs stats``, and the history the worker kept."""
    c = demo.console
    c.step(7, "The one dashboard that matters")
    c.explain(
        "sqla_jobs.observe.stats.collect/render (also `sqla-jobs stats`): jobs by state and the age of "
        "the oldest due pending job, the true queue latency. If it climbs while claims stay "
        "flat you are out of workers; if dead climbs, a handler is broken."
    )
    c.say()
    c.say(render(collect(demo.url, schema=demo.schema)))
    done = demo.value(select(func.count()).select_from(JobHistory))
    c.say(f"sqla_jobs_history: {done} finished jobs")
    c.explain(
        "The honest cost: every job wrote at least three row versions (insert, claim, delete), "
        "so the queue table makes dead tuples as fast as it runs jobs, and autovacuum, not "
        "SKIP LOCKED, sets the ceiling. The migration tunes the table's autovacuum settings; "
        "watch n_dead_tup and the last autovacuum (the line above), and the oldest open "
        "transaction, which stops vacuum from removing them."
    )


def contention(demo: Demo) -> None:
    """Step 8: the same claim with and without SKIP LOCKED, on as many connections at once."""
    c = demo.console
    c.step(8, "Measured: FOR UPDATE vs FOR UPDATE SKIP LOCKED")
    c.explain(
        f"The version people write first, and the fix, side by side, with the benchmark's "
        f"contention code: {RACE_CONNECTIONS} connections, {RACE_SECONDS:g} s each, over "
        f"{RACE_JOBS:,} pending jobs in a plain table of the design doc's (bench/baseline.py). "
        "Each claim is one statement: UPDATE jobs SET state = 'running' ... WHERE id = (SELECT id "
        "... WHERE state = 'pending' ORDER BY run_at LIMIT 1 FOR UPDATE [SKIP LOCKED]) "
        "RETURNING ...; then DELETE."
    )
    baseline.create_schema(libpq_conninfo(demo.url))
    try:
        plain = _race_one(demo, skip_locked=False)
        skip = _race_one(demo, skip_locked=True)
    finally:
        with connect(demo.url) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("jobs")))
    k = RACE_CONNECTIONS
    ratio = skip["claims_per_s"] / plain["claims_per_s"] if plain["claims_per_s"] else float("inf")
    c.say()
    c.say(f"{'':<34} {'FOR UPDATE':>12} {'SKIP LOCKED':>12}")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("jobs claimed", lambda r: f"{r['claims_per_s'] * RACE_SECONDS:,.0f}"),
        ("claims per second", lambda r: f"{r['claims_per_s']:,.0f}"),
        ("connections waiting on a lock", lambda r: f"{r['blocked_share'] * k:.1f} of {k}"),
        ("time waiting on locks, total", lambda r: f"{r['blocked_seconds']:.2f} s"),
        ("claim round trip, median", lambda r: f"{r['claim_ms_p50']:.2f} ms"),
        ("claim round trip, p99", lambda r: f"{r['claim_ms_p99']:.2f} ms"),
        ("claims that came back empty", lambda r: f"{r['empty_claims']}"),
    ]
    for label, value in rows:
        c.say(f"{label:<34} {value(plain):>12} {value(skip):>12}")
    c.say()
    c.explain(
        f"SKIP LOCKED claimed {ratio:.1f}x as many jobs per second, and its connections spent "
        f"{skip['blocked_seconds']:.2f} s waiting on locks in all, against "
        f"{plain['blocked_seconds']:.2f} s without it."
    )
    c.explain(
        "Without SKIP LOCKED every connection picks the same oldest row and queues behind its "
        "lock; when the holder commits, the others re-check the row, find it no longer pending "
        "and move on to the next one, where they queue again: one claim per lock hold, however "
        "many workers. With SKIP LOCKED each connection steps over locked rows and takes the "
        "next one; the price is that ORDER BY becomes advisory under load. (The waiting "
        "figures are sampled from pg_stat_activity every 10 ms. The claim rates depend on the "
        "machine: the connections share its CPUs, so on a small one the ratio varies from run "
        "to run while the time spent waiting on locks does not; `nox -s bench` measures both "
        "with repeats.)"
    )


def _race_one(demo: Demo, *, skip_locked: bool) -> dict[str, Any]:
    label = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
    with connect(demo.url) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier("jobs")))
    prefill("baseline", demo.url, RACE_JOBS)
    with connect(demo.url) as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier("jobs")))
    result = race(demo.url, RACE_CONNECTIONS, skip_locked, RACE_SECONDS)
    claims = result["claims_per_s"] * RACE_SECONDS
    demo.console.say(
        f"{label:<23} {claims:>7,.0f} claims in {RACE_SECONDS:.1f} s "
        f"({result['claims_per_s']:,.0f}/s)"
    )
    return result
