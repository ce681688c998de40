"""The honest account: a sustained load with workers keeping up, sampled every few seconds.

An enqueuer thread adds jobs at a fixed rate (``enqueue_many`` every 50 ms); one worker process
(concurrency 16) drains them. Every few seconds: table and index size, dead tuples, autovacuum
runs, queue depth and the worker's RSS. A figure is called bounded when, after the first fifth
(warm-up), its peak over the second half of the run is within 1.2x (plus a little slack) of its peak
over the first half: linear growth gives about 1.7x, a vacuum sawtooth about 1x.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy.orm import Session

from .app import Ping, make_engine, make_jobs
from .dbs import TABLE, connect, count_rows, fresh_database, table_stats
from .figures import Outcome, Row, Series, Target
from .procs import Children, memory_kb
from .settings import Context

TICK = 0.05
WARMUP_SHARE = 0.2
TABLE_NAME = TABLE["sqla_jobs"]
#: Slack for "bounded": a few pages of churn, a few hundred dead tuples, a few MB of RSS.
SLACK = {
    "total_bytes": 128 * 1024,
    "table_bytes": 64 * 1024,
    "index_bytes": 64 * 1024,
    "n_dead_tup": 250,
    "rss_kb": 4 * 1024,
}


class Enqueuer(threading.Thread):
    """Enqueues ``rate`` jobs per second, in one ``enqueue_many`` transaction per tick."""

    def __init__(self, url: str, rate: float) -> None:
        super().__init__(name="bench-enqueuer", daemon=True)
        self.url = url
        self.rate = rate
        self.sent = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)

    def run(self) -> None:
        jobs = make_jobs()
        engine = make_engine(self.url)
        try:
            t0 = time.perf_counter()
            while not self._stop_event.is_set():
                due = int(self.rate * (time.perf_counter() - t0)) - self.sent
                if due > 0:
                    with Session(engine) as s, s.begin():
                        jobs.enqueue_many(s, [Ping(n=self.sent + i) for i in range(due)])
                    self.sent += due
                self._stop_event.wait(TICK)
        except BaseException as exc:
            self.error = exc
        finally:
            engine.dispose()


def bounded(samples: list[dict[str, Any]], key: str, duration: float) -> dict[str, Any]:
    """Peaks of ``key`` over the two halves after warm-up, their ratio, the verdict, and the
    least-squares slope per minute."""
    warm = [s for s in samples if s["t"] >= duration * WARMUP_SHARE and s["t"] <= duration]
    if len(warm) < 4:
        return {"bounded": None, "first_peak": None, "second_peak": None, "slope_per_min": None}
    mid = warm[0]["t"] + (warm[-1]["t"] - warm[0]["t"]) / 2
    first = max(s[key] for s in warm if s["t"] <= mid)
    second = max(s[key] for s in warm if s["t"] > mid)
    ts = [s["t"] for s in warm]
    ys = [float(s[key]) for s in warm]
    t_mean, y_mean = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - t_mean) ** 2 for t in ts)
    slope = (
        sum((t - t_mean) * (y - y_mean) for t, y in zip(ts, ys, strict=True)) / var if var else 0.0
    )
    return {
        "bounded": second <= 1.2 * first + SLACK.get(key, 0),
        "first_peak": first,
        "second_peak": second,
        "slope_per_min": slope * 60,
    }


def _sample(conn: Any, t: float, worker_pid: int, sent: int) -> dict[str, Any]:
    st = table_stats(conn, TABLE_NAME)
    pending = count_rows(conn, TABLE_NAME, "state = 'pending'")
    return {
        "t": t,
        "table_bytes": st.table_bytes,
        "index_bytes": st.index_bytes,
        "total_bytes": st.table_bytes + st.index_bytes,
        "n_dead_tup": st.n_dead_tup,
        "n_live_tup": st.n_live_tup,
        "autovacuum_count": st.autovacuum_count,
        "queue_depth": pending,
        "rss_kb": memory_kb(worker_pid).get("VmRSS", 0),
        "enqueued": sent,
    }


def sustained_once(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    duration, every = sizes.sustained_seconds, sizes.sustained_sample_every
    samples: list[dict[str, Any]] = []
    with (
        fresh_database(ctx.server_url, "sqla_jobs") as url,
        connect(url) as conn,
        Children() as children,
    ):
        child = children.spawn(
            "worker", "--impl", "sqla", "--url", url,
            "--loops", str(sizes.sustained_concurrency),
        )  # fmt: skip
        child.wait_ready()
        child.go()
        enqueuer = Enqueuer(url, sizes.sustained_rate)
        t0 = time.monotonic()
        enqueuer.start()
        while True:
            t = time.monotonic() - t0
            samples.append(_sample(conn, t, child.pid, enqueuer.sent))
            if t >= duration or enqueuer.error is not None:
                break
            time.sleep(max(0.0, min(every * len(samples), duration) - (time.monotonic() - t0)))
        enqueuer.stop()
        if enqueuer.error is not None:
            raise RuntimeError(f"the enqueuer failed: {enqueuer.error!r}")
        # Let the workers catch up, so "done" counts everything that was enqueued.
        deadline = time.monotonic() + 30
        while count_rows(conn, TABLE_NAME) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftover = count_rows(conn, TABLE_NAME)
        result = child.finish()
    warm = [s for s in samples if s["t"] >= duration * WARMUP_SHARE]
    return {
        "samples": samples,
        "enqueued": enqueuer.sent,
        "done": int(result["done"]),
        "left_in_table": leftover,
        "rate": int(result["done"]) / duration,
        "max_queue_depth": max(s["queue_depth"] for s in samples),
        "size": bounded(samples, "total_bytes", duration),
        "heap": bounded(samples, "table_bytes", duration),
        "indexes": bounded(samples, "index_bytes", duration),
        "dead": bounded(samples, "n_dead_tup", duration),
        "rss": bounded(samples, "rss_kb", duration),
        "rss_start_kb": warm[0]["rss_kb"] if warm else None,
        "rss_end_kb": samples[-1]["rss_kb"],
        "autovacuum_runs": samples[-1]["autovacuum_count"],
    }


def _flag(value: bool | None) -> float:
    return float("nan") if value is None else float(value)


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    keys = (
        "size_ok",
        "heap_ok",
        "index_ok",
        "dead_ok",
        "end_mb",
        "growth_mb_min",
        "index_growth_mb_min",
        "depth",
        "rate",
        "rss_ratio",
        "rss_mb",
    )
    series = {k: Series() for k in keys}
    runs: list[dict[str, Any]] = []
    with connect(ctx.server_url) as conn:
        row = conn.execute("SELECT current_setting('autovacuum')").fetchone()
        autovacuum = str(row[0]) if row else "?"
    for rep in range(ctx.repeat):
        r = sustained_once(ctx)
        runs.append(r)
        last = r["samples"][-1]
        series["size_ok"].add(_flag(r["size"]["bounded"]))
        series["heap_ok"].add(_flag(r["heap"]["bounded"]))
        series["index_ok"].add(_flag(r["indexes"]["bounded"]))
        series["dead_ok"].add(_flag(r["dead"]["bounded"]))
        series["end_mb"].add(last["total_bytes"] / 2**20)
        series["growth_mb_min"].add((r["size"]["slope_per_min"] or 0.0) / 2**20)
        series["index_growth_mb_min"].add((r["indexes"]["slope_per_min"] or 0.0) / 2**20)
        series["depth"].add(r["max_queue_depth"])
        series["rate"].add(r["rate"])
        start_kb = r["rss_start_kb"] or 0
        series["rss_ratio"].add(r["rss_end_kb"] / start_kb if start_kb else float("nan"))
        series["rss_mb"].add(r["rss_end_kb"] / 1024)
        ctx.log(
            f"sustained rep {rep + 1}: {r['rate']:,.0f} jobs/s done, max depth "
            f"{r['max_queue_depth']}, table+indexes {last['total_bytes'] / 2**20:.1f} MB at end "
            f"(bounded: {r['size']['bounded']}; heap {r['heap']['bounded']}, indexes "
            f"{r['indexes']['bounded']}), dead tuples {last['n_dead_tup']} "
            f"(bounded: {r['dead']['bounded']}), autovacuum runs {r['autovacuum_runs']}, "
            f"worker RSS {r['rss_start_kb']} -> {r['rss_end_kb']} KiB"
        )
    what = f"{sizes.sustained_rate:g} jobs/s for {sizes.sustained_seconds:g} s"
    note = f"server autovacuum = {autovacuum}"
    rows = [
        Row("sustained", f"table + index size stays bounded, {what}", "bool",
            series["size_ok"], target=Target("true"), note=note),
        Row("sustained", "table (heap) stays bounded", "bool", series["heap_ok"], note=note),
        Row("sustained", "indexes stay bounded", "bool", series["index_ok"], note=note),
        Row("sustained", "dead tuples stay bounded", "bool", series["dead_ok"],
            target=Target("true"), note=note),
        Row("sustained", "table + index size at the end", "MB", series["end_mb"]),
        Row("sustained", "table + index growth after warm-up", "MB/min", series["growth_mb_min"]),
        Row("sustained", "index growth after warm-up", "MB/min", series["index_growth_mb_min"]),
        Row("sustained", "max queue depth (pending jobs at a sample)", "jobs", series["depth"]),
        Row("sustained", "jobs done per second", "jobs/s", series["rate"]),
        Row("memory", f"worker RSS end / after warm-up, sustained c={sizes.sustained_concurrency}",
            "x", series["rss_ratio"], target=Target("abs_max", 1.1, "x")),
        Row("memory", f"worker RSS at the end, sustained c={sizes.sustained_concurrency}", "MB",
            series["rss_mb"], target=Target("abs_max", 150.0, "MB")),
    ]  # fmt: skip
    return Outcome(rows, {"autovacuum": autovacuum, "duration": sizes.sustained_seconds,
                          "rate": sizes.sustained_rate, "runs": runs})  # fmt: skip
