"""Delayed-job lateness: how long after its ``run_at`` a delayed job starts, by the database clock.

An idle listening worker polling every 5 s (:func:`bench.latency.listening_worker`, whose handler
records ``time.time()`` at start); this process enqueues a dozen jobs, one transaction each, delayed
1 to 3 s (in a shuffled order), and reads each job's ``run_at`` from the enqueue (the database's).
Lateness is the handler's start minus ``run_at``, with the worker's clock carried to the
database's by the offset measured here (the same host: about zero). A negative figure would be a
job started early. Beside it, the same run with ``wakeup="none"`` (the poll, and what the worker's
last poll probe knew), as a reference.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from .app import Ping, make_engine, make_jobs
from .dbs import TABLE, connect, fresh_database, wait_empty
from .figures import Outcome, Row, Series, Target, percentile
from .latency import listening_worker
from .settings import Context

POLL = 5.0
JOBS = 12
#: The delays, seconds: spread over 1 to 3 s.
DELAYS = [1.0 + 2.0 * i / (JOBS - 1) for i in range(JOBS)]


def clock_offset(conn: psycopg.Connection[Any]) -> float:
    """The database's clock minus ``time.time()``, seconds (the best of a few readings)."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        before = time.time()
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        after = time.time()
        assert row is not None
        reading = (after - before, float(row[0]) - (before + after) / 2)
        best = reading if best is None or reading < best else best
    assert best is not None
    return best[1]


def lateness(url: str, wakeup: str | None, seed: int) -> tuple[list[float], int]:
    """Lateness in ms of each delayed job that started, and how many never did."""
    delays = DELAYS[:]
    random.Random(seed).shuffle(delays)
    jobs = make_jobs(wakeup=wakeup)
    engine = make_engine(url)
    run_at: dict[int, float] = {}
    try:
        with (
            listening_worker("sqla_jobs", url, poll=POLL, wakeup=wakeup) as child,
            connect(url) as conn,
        ):
            offset = clock_offset(conn)
            for n, delay in enumerate(delays):
                with Session(engine) as s, s.begin():
                    job = jobs.enqueue(s, Ping(n=n), delay=timedelta(seconds=delay))
                    run_at[n] = job.run_at.timestamp()
                time.sleep(0.05)
            try:
                wait_empty(conn, TABLE["sqla_jobs"], timeout=max(DELAYS) + POLL + 5)
            except TimeoutError:
                pass
            starts = {int(k): float(v) for k, v in child.finish()["starts"].items()}
    finally:
        engine.dispose()
    late = [(starts[n] + offset - run_at[n]) * 1000 for n in run_at if n in starts]
    return late, len(run_at) - len(late)


def run(ctx: Context) -> Outcome:
    who = ("after_commit", "none")
    stats = {w: {s: Series() for s in ("p50", "max", "min")} for w in who}
    raw: dict[str, Any] = {w: [] for w in who}
    never = dict.fromkeys(who, 0)
    for rep in range(ctx.repeat):
        for wakeup in who if rep % 2 == 0 else who[::-1]:
            with fresh_database(ctx.server_url, "sqla_jobs") as url:
                late, missing = lateness(url, None if wakeup == "after_commit" else wakeup, rep)
            stats[wakeup]["p50"].add(percentile(late, 50))
            stats[wakeup]["max"].add(max(late, default=float("nan")))
            stats[wakeup]["min"].add(min(late, default=float("nan")))
            never[wakeup] += missing
            raw[wakeup].append({"lateness_ms": late, "missing": missing})
            ctx.log(
                f"delayed-job lateness wakeup={wakeup} rep {rep + 1}: p50 "
                f"{percentile(late, 50):.1f} ms, max {max(late, default=float('nan')):.1f} ms, "
                f"min {min(late, default=float('nan')):.1f} ms, {missing} never started"
            )
    name = f"{JOBS} jobs delayed 1-3 s, worker polling every {POLL:g} s"
    ours, poll = stats["after_commit"], stats["none"]
    label = 'wakeup="none"'
    rows = [
        Row("delayed", f"delayed-job lateness p50, {name}", "ms", ours["p50"], poll["p50"],
            label, Target("abs_max", 50.0, "ms")),
        Row("delayed", f"delayed-job lateness max, {name}", "ms", ours["max"], poll["max"],
            label, Target("abs_max", 250.0, "ms")),
        Row("delayed", f"delayed-job lateness min (negative: early), {name}", "ms", ours["min"],
            poll["min"], label, Target("abs_min", 0.0, "ms")),
    ]  # fmt: skip
    if never["after_commit"]:
        rows[0].note = f"{never['after_commit']} jobs never started"
    return Outcome(rows, raw)
