"""Pickup latency: from the enqueuing COMMIT returning to the handler starting.

The idle worker listens in a child process (poll interval 10 s, so NOTIFY is what delivers) and its
handler records the wall-clock time it starts; this process enqueues one job at a time, a fixed
gap apart, and records the wall-clock time each COMMIT returned. Both ends run on this machine and
read the same clock (``time.time``). A separate process keeps the enqueuer off the worker's GIL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from sqla_jobs._db import libpq_conninfo

from . import baseline
from .app import KIND, Ping, make_engine, make_jobs, payload_dict
from .dbs import TABLE, Subject, connect, fresh_database, wait_empty
from .figures import Outcome, Row, Series, Target, percentile
from .procs import Children
from .settings import Context

POLL = 10.0
WARMUP = 10

Enqueue = Callable[[int], None]


@contextmanager
def _enqueuer(subject: Subject, url: str) -> Iterator[Enqueue]:
    """One job per transaction: ``jobs.enqueue`` through a Session, or the doc's INSERT."""
    if subject == "sqla_jobs":
        jobs = make_jobs()
        engine = make_engine(url)

        def orm(i: int) -> None:
            with Session(engine) as s, s.begin():
                jobs.enqueue(s, Ping(n=i))

        try:
            yield orm
        finally:
            engine.dispose()
        return
    with psycopg.connect(libpq_conninfo(url)) as conn:

        def raw(i: int) -> None:
            baseline.insert_one(conn, KIND, payload_dict(i))

        yield raw


def latencies(subject: Subject, url: str, n: int, gap: float) -> tuple[list[float], int]:
    """Enqueue ``n`` jobs ``gap`` apart (after a warm-up) to an idle listening worker; return the
    latencies in ms and how many jobs never started."""
    impl = "sqla" if subject == "sqla_jobs" else "baseline"
    table = TABLE[subject]
    with Children() as children, connect(url) as conn, _enqueuer(subject, url) as enqueue:
        child = children.spawn("listen-worker", "--impl", impl, "--url", url, "--poll", str(POLL))
        child.wait_ready()
        child.go()
        child.expect("listening")
        for i in range(-WARMUP, 0):
            enqueue(i)
            time.sleep(gap)
        wait_empty(conn, table, timeout=POLL + 5)
        commits: dict[int, float] = {}
        tick = time.perf_counter()
        for i in range(n):
            enqueue(i)
            commits[i] = time.time()
            tick += gap
            time.sleep(max(0.0, tick - time.perf_counter()))
        try:
            wait_empty(conn, table, timeout=POLL + 5)
        except TimeoutError:
            pass
        starts = {int(k): float(v) for k, v in child.finish()["starts"].items()}
    lat = [(starts[i] - commits[i]) * 1000 for i in range(n) if i in starts]
    return lat, n - len(lat)


def run(ctx: Context) -> Outcome:
    n, gap = ctx.sizes.latency_jobs, ctx.sizes.latency_gap
    subjects: tuple[Subject, Subject] = ("sqla_jobs", "baseline")
    pct = {s: {q: Series() for q in (50, 95, 99)} for s in subjects}
    raw: dict[str, Any] = {s: [] for s in subjects}
    for rep in range(ctx.repeat):
        for subject in subjects if rep % 2 == 0 else subjects[::-1]:
            with fresh_database(ctx.server_url, subject) as url:
                lat, missing = latencies(subject, url, n, gap)
            for q in (50, 95, 99):
                pct[subject][q].add(percentile(lat, q))
            raw[subject].append({"latencies_ms": lat, "missing": missing})
            ctx.log(
                f"pickup {subject} rep {rep + 1}: p50 {percentile(lat, 50):.2f} ms, "
                f"p95 {percentile(lat, 95):.2f} ms, p99 {percentile(lat, 99):.2f} ms, "
                f"{missing} never started"
            )
    name = f"{n} jobs {gap * 1000:g} ms apart, idle listening worker"
    rows = [
        Row("pickup", f"p50, {name}", "ms", pct["sqla_jobs"][50], pct["baseline"][50],
            "LISTEN worker", Target("ratio_max", 1.5)),
        Row("pickup", f"p95, {name}", "ms", pct["sqla_jobs"][95], pct["baseline"][95],
            "LISTEN worker"),
        Row("pickup", f"p99, {name}", "ms", pct["sqla_jobs"][99], pct["baseline"][99],
            "LISTEN worker", Target("abs_max", 10.0, "ms")),
    ]  # fmt: skip
    missing = sum(r["missing"] for r in raw["sqla_jobs"])
    if missing:
        rows[0].note = f"{missing} jobs never started within the poll interval"
    return Outcome(rows, raw)
