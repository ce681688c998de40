"""Memory: peak RSS of a worker process draining many jobs, and of a process calling
``enqueue_many`` with as many. (RSS over the sustained run is measured by :mod:`bench.sustained`.)

Peak RSS is the kernel's high-water mark (``VmHWM`` in ``/proc/<pid>/status``), read while the
process is still alive; VmRSS is also sampled every 100 ms for the JSON.
"""

from __future__ import annotations

from typing import Any

from .app import prefill
from .dbs import TABLE, Subject, connect, fresh_database, wait_empty
from .drain import IMPLS
from .figures import Outcome, Row, Series, Target
from .procs import Children, RssSampler, memory_kb
from .settings import Context

MB = 1024.0


def worker_peak(ctx: Context, impl: str) -> dict[str, Any]:
    n, concurrency = ctx.sizes.memory_jobs, ctx.sizes.memory_concurrency
    subject = IMPLS[impl]
    with fresh_database(ctx.server_url, subject) as url, connect(url) as conn:
        prefill(subject, url, n)
        with Children() as children:
            child = children.spawn(
                "worker", "--impl", impl, "--url", url, "--loops", str(concurrency)
            )
            child.wait_ready()
            idle_kb = memory_kb(child.pid).get("VmRSS", 0)
            sampler = RssSampler(child.pid)
            sampler.start()
            child.go()
            wait_empty(conn, TABLE[subject], timeout=max(300.0, n / 100))
            hwm_kb = memory_kb(child.pid).get("VmHWM", 0)
            sampler.stop()
            child.finish()
    return {
        "peak_mb": max(hwm_kb, sampler.hwm_kb) / MB,
        "idle_mb": idle_kb / MB,
        "rss_samples_kb": sampler.samples[:: max(1, len(sampler.samples) // 200)],
    }


def enqueue_peak(ctx: Context, mode: str) -> dict[str, Any]:
    subject: Subject = "sqla_jobs" if mode == "enqueue-many" else "baseline"
    with fresh_database(ctx.server_url, subject) as url, Children() as children:
        child = children.spawn(mode, "--url", url, "--jobs", str(ctx.sizes.memory_jobs))
        r = child.result()
    return {
        "peak_mb": int(r["hwm_kb"]) / MB,
        "start_mb": int(r["start_kb"]) / MB,
        "payloads_mb": int(r["payloads_kb"]) / MB,
        "seconds": float(r["seconds"]),
    }


def run(ctx: Context) -> Outcome:
    n, concurrency = ctx.sizes.memory_jobs, ctx.sizes.memory_concurrency
    worker = {impl: Series() for impl in ("sqla", "batched")}
    enq = {mode: Series() for mode in ("enqueue-many", "copy")}
    raw: dict[str, list[dict[str, Any]]] = {k: [] for k in (*worker, *enq)}
    for rep in range(ctx.repeat):
        for impl in worker:
            r = worker_peak(ctx, impl)
            worker[impl].add(r["peak_mb"])
            raw[impl].append(r)
            ctx.log(
                f"memory worker {impl} rep {rep + 1}: peak {r['peak_mb']:.1f} MB "
                f"(idle {r['idle_mb']:.1f} MB)"
            )
        for mode in enq:
            r = enqueue_peak(ctx, mode)
            enq[mode].add(r["peak_mb"])
            raw[mode].append(r)
            ctx.log(
                f"memory {mode} rep {rep + 1}: peak {r['peak_mb']:.1f} MB "
                f"(after imports {r['start_mb']:.1f}, with payloads {r['payloads_mb']:.1f})"
            )
    rows = [
        Row("memory", f"worker peak RSS draining {n:,} jobs, concurrency {concurrency}", "MB",
            worker["sqla"], worker["batched"], f"batched, {concurrency} loops",
            Target("abs_max", 150.0, "MB")),
        Row("memory", f"peak RSS of a process enqueueing {n:,} jobs in one call", "MB",
            enq["enqueue-many"], enq["copy"], "COPY", Target("abs_max", 250.0, "MB"),
            note="includes the interpreter, imports and the payload objects"),
    ]  # fmt: skip
    return Outcome(rows, raw)
