"""The commit path with the library itself: processes enqueueing through Sessions, the shipped
notifier beside them.

Where :mod:`bench.commit_path` simulates the writers and the notifier with pgbench, this runs
``writers`` threads in ``writers / CLIENTS_PER_PROCESS`` processes, each thread enqueueing one
job per ``Session`` transaction as fast as it can for the same number of seconds, once with
``Jobs(wakeup="none")`` (the reference) and once with the default ``"after_commit"`` (each process
then has its own notifier, as an application server would), in an order that alternates per
repetition; commits/s of the two, and the ratio of each repetition. One listening connection
consumes the notifications, and ``pg_stat_activity`` is sampled for ``Lock/object`` waits, as in
the pgbench runs. The writer processes are Python, so on a small machine they are bound by their
own CPU before the server's commit path: the ratio says what the notifier costs them all in all.

``python -m bench.commit_path_lib writer ...`` is one writer process.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from sqla_jobs.db.urls import sqlalchemy_url

from .app import Ping, make_jobs
from .child import say, wait_for
from .commit_path import CLIENTS_PER_PROCESS, Listener, LockSampler
from .dbs import connect, fresh_database
from .figures import Outcome, Row, Series
from .procs import Child, Children
from .settings import Context

MODES = ("none", "after_commit")


def _writer(url: str, wakeup: str, threads: int, seconds: float) -> None:
    from sqla_jobs.enqueue import notifier as _notifier

    jobs = make_jobs(wakeup=wakeup)
    engine = create_engine(sqlalchemy_url(url), pool_size=threads, max_overflow=0)
    counts = [0] * threads
    go = threading.Event()
    deadline = [0.0]

    def loop(k: int) -> None:
        go.wait()
        n = 0
        while time.monotonic() < deadline[0]:
            with Session(engine) as s, s.begin():
                jobs.enqueue(s, Ping(n=n))
            n += 1
        counts[k] = n

    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    # Warm the pool (and the notifier's connection) before the clock starts.
    with Session(engine) as s, s.begin():
        jobs.enqueue(s, Ping(n=-1))
    say("ready")
    wait_for("go")
    start = time.monotonic()
    deadline[0] = start + seconds
    go.set()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - start
    sent = sum(n.sent for n in _notifier._notifiers.values())
    engine.dispose()
    say({"commits": sum(counts), "seconds": elapsed, "sent": sent})


def run_once(url: str, wakeup: str, writers: int, seconds: float) -> dict[str, float]:
    """One run on an emptied job table: commits/s of all the writers, NOTIFY statements/s their
    notifiers sent, notifications/s heard, peak ``Lock/object`` waiters."""
    with connect(url) as conn:
        conn.execute("TRUNCATE sqla_jobs_job")
        with contextlib.suppress(psycopg.Error):
            conn.execute("CHECKPOINT")
    procs = max(1, writers // CLIENTS_PER_PROCESS)
    per = max(1, writers // procs)
    listener = Listener(url)
    listener.start()
    listener.ready.wait(10)
    sampler = LockSampler(url)
    try:
        with Children() as children:
            for _ in range(procs):
                child = Child(
                    "writer", "--url", url, "--wakeup", wakeup, "--threads", str(per),
                    "--seconds", str(seconds), module="bench.commit_path_lib",
                )  # fmt: skip
                children.items.append(child)
            for child in children.items:
                child.wait_ready()
            sampler.start()
            for child in children.items:
                child.go()
            results = [child.result(seconds + 60) for child in children.items]
    finally:
        if sampler.is_alive():
            sampler.stop()
        listener.stop()
    elapsed = max(r["seconds"] for r in results)
    return {
        "commits_per_s": sum(r["commits"] for r in results) / elapsed,
        "sent_per_s": sum(r["sent"] for r in results) / elapsed,
        "heard_per_s": listener.count / elapsed,
        "peak_object_waits": float(max(sampler.object_waits or [0])),
    }


def run(ctx: Context, raw: dict[str, Any]) -> list[Row]:
    """The library's rows of the commit-path measurement (``raw["library"]``: every run)."""
    seconds = ctx.sizes.commit_path_seconds
    runs: list[dict[str, Any]] = raw.setdefault("library", [])
    rows = []
    for writers in ctx.sizes.commit_path_library_writers:
        rate = {m: Series() for m in MODES}
        ratios = []
        for rep in range(ctx.repeat):
            got = {}
            with fresh_database(ctx.server_url, "sqla_jobs") as url:
                for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                    r = got[mode] = run_once(url, mode, writers, seconds)
                    rate[mode].add(r["commits_per_s"])
                    runs.append({"rep": rep, "writers": writers, "wakeup": mode, **r})
                    ctx.log(
                        f"commit_path library {writers} writers wakeup={mode} rep {rep + 1}: "
                        f"{r['commits_per_s']:,.0f} commits/s, notifier {r['sent_per_s']:,.0f} "
                        f"statements/s, heard {r['heard_per_s']:,.0f}/s, Lock/object peak "
                        f"{r['peak_object_waits']:.0f}"
                    )
            ratios.append(got["after_commit"]["commits_per_s"] / got["none"]["commits_per_s"])
        procs = max(1, writers // CLIENTS_PER_PROCESS)
        rows.append(
            Row(
                "commit_path",
                f"library: {writers} writer threads in {procs} processes enqueueing through "
                "Sessions, wakeup=after_commit (default) vs wakeup=none",
                "commits/s",
                rate["after_commit"],
                rate["none"],
                "wakeup=none",
                note="same-repetition ratios "
                + ", ".join(f"{r:.2f}x" for r in ratios)
                + f" (median {statistics.median(ratios):.2f}x)",
                subject_label="wakeup=after_commit",
            )
        )
    return rows


def measure(ctx: Context) -> Outcome:
    """The library's rows alone (``--only commit_path_library``)."""
    raw: dict[str, Any] = {}
    return Outcome(run(ctx, raw), raw)


def _main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.commit_path_lib")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--url", required=True)
    w.add_argument("--wakeup", required=True)
    w.add_argument("--threads", type=int, required=True)
    w.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    _writer(args.url, args.wakeup, args.threads, args.seconds)


if __name__ == "__main__":
    _main()
