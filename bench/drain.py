"""Drain throughput: pre-enqueued no-op jobs, from the workers' start until the table is empty.

Every worker runs as a child process (one, or two sharing the concurrency), so one and two
processes are measured the same way and the parent's polling never competes for the workers' GIL.
The clock starts when the children, already imported and set up, are told to go.
"""

from __future__ import annotations

import math
import time
from typing import Any

import psycopg

from .app import prefill
from .dbs import TABLE, Subject, connect, fresh_database, wait_empty
from .figures import Outcome, Row, Series, Target
from .procs import Children, cpu_seconds
from .settings import Context

#: impl -> the schema it runs on.
IMPLS: dict[str, Subject] = {"sqla": "sqla_jobs", "batched": "baseline", "single": "baseline"}


def backend_cpu(conn: psycopg.Connection[Any]) -> float:
    """CPU seconds used so far by the server processes serving this database, other than
    ``conn``'s own (the workers' connections, for a drain): NaN unless every one of them is a
    process this machine can read (a local server)."""
    pids = [
        int(r[0])
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    ]
    return sum(cpu_seconds(pid) for pid in pids) if pids else math.nan


def drain_once(
    ctx: Context, impl: str, concurrency: int, processes: int, jobs: int, *, limited: bool = False
) -> dict[str, float]:
    """One drain in a fresh database; returns jobs/s, and the CPU time per job (microseconds) of
    the worker processes and of the server processes serving them. ``limited``: sqla-jobs' jobs
    of a rate limited kind (a limit never reached, ``bench.app.LIMITED``)."""
    subject = IMPLS[impl]
    with fresh_database(ctx.server_url, subject) as url:
        prefill(subject, url, jobs, limited=limited)
        extra = ("--rate-limited",) if limited else ()
        return drain_in(url, impl, concurrency, processes, jobs, *extra)


def drain_in(
    url: str, impl: str, concurrency: int, processes: int, jobs: int, *extra: str
) -> dict[str, float]:
    """Drain the ``jobs`` already in ``url``'s queue table (:func:`drain_once`'s figures);
    ``extra`` goes to each worker child's command line (``--handler NAME``)."""
    subject = IMPLS[impl]
    with Children() as children, connect(url) as conn:
        procs = [
            children.spawn(
                "worker",
                "--impl",
                impl,
                "--url",
                url,
                "--loops",
                str(concurrency // processes),
                *extra,
            )
            for _ in range(processes)
        ]
        for p in procs:
            p.wait_ready()
        cpu0 = sum(cpu_seconds(p.pid) for p in procs)
        t0 = time.perf_counter()
        for p in procs:
            p.go()
        t1 = wait_empty(conn, TABLE[subject], timeout=max(120.0, jobs / 100))
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
        # The workers' backends started with the drain (they connect on "go"): their whole
        # CPU time is the drain's, give or take connecting.
        server = backend_cpu(conn)
        results: list[dict[str, Any]] = [p.finish() for p in procs]
    done = sum(int(r["done"]) for r in results)
    errors = [e for r in results for e in r.get("errors", [])]
    if errors or done != jobs:
        raise RuntimeError(
            f"drain {' '.join((impl, *extra))}: {done} of {jobs} done, errors {errors}"
        )
    return {
        "rate": jobs / (t1 - t0),
        "cpu_us_per_job": cpu / jobs * 1e6,
        "server_cpu_us_per_job": server / jobs * 1e6,
    }


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    out = Outcome()
    for concurrency in sizes.drain_concurrency:
        for processes in (1, 2):
            rates = {impl: Series() for impl in IMPLS}
            cpus = {impl: Series() for impl in IMPLS}
            servers = {impl: Series() for impl in IMPLS}
            impls = list(IMPLS)
            for rep in range(ctx.repeat):
                # Rotate the order per repetition so drift does not favour anyone.
                for impl in impls[rep % 3 :] + impls[: rep % 3]:
                    r = drain_once(ctx, impl, concurrency, processes, sizes.drain_jobs)
                    rates[impl].add(r["rate"])
                    cpus[impl].add(r["cpu_us_per_job"])
                    if not math.isnan(r["server_cpu_us_per_job"]):
                        servers[impl].add(r["server_cpu_us_per_job"])
                    ctx.log(
                        f"drain c={concurrency} procs={processes} {impl} rep {rep + 1}: "
                        f"{r['rate']:,.0f} jobs/s, worker CPU {r['cpu_us_per_job']:.0f} us/job, "
                        f"server CPU {r['server_cpu_us_per_job']:.0f} us/job"
                    )
            label = f"concurrency {concurrency}, {processes} process{'es' if processes > 1 else ''}"
            out.rows += [
                Row(
                    "drain",
                    f"{sizes.drain_jobs:,} jobs, {label} vs batched claim",
                    "jobs/s",
                    rates["sqla"],
                    rates["batched"],
                    f"batched ({concurrency} loops)",
                    Target("ratio_min", 0.8),
                ),
                Row(
                    "drain",
                    f"{sizes.drain_jobs:,} jobs, {label} vs single claim",
                    "jobs/s",
                    rates["sqla"],
                    rates["single"],
                    f"single ({concurrency} loops)",
                ),
                Row(
                    "drain",
                    f"worker CPU per job, {label} vs batched claim",
                    "us/job",
                    cpus["sqla"],
                    cpus["batched"],
                    "batched",
                    note="user+system CPU of the worker processes",
                ),
            ]
            if servers["sqla"].samples and servers["batched"].samples:
                out.rows.append(
                    Row(
                        "drain",
                        f"server CPU per job, {label} vs batched claim",
                        "us/job",
                        servers["sqla"],
                        servers["batched"],
                        "batched",
                        note="user+system CPU of the PostgreSQL backends serving the workers "
                        "(local servers only)",
                    )
                )
            out.raw[f"c{concurrency}_p{processes}"] = {
                impl: {
                    "rate": rates[impl].as_dict(),
                    "cpu_us_per_job": cpus[impl].as_dict(),
                    "server_cpu_us_per_job": servers[impl].as_dict(),
                }
                for impl in IMPLS
            }
    return out
