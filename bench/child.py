"""Entry point of the benchmark's child processes (``python -m bench.child ...``).

``worker --impl sqla|single|batched``: a sqla-jobs ``Worker`` (``--handler``: one of the session
measurement's) or the baseline's claim loops; prints ``ready``, starts on ``go``, stops on
``stop``, prints its result as JSON. ``enqueue-many`` and ``copy`` insert ``--jobs`` jobs in one
transaction and print their memory as JSON. (The idle listening worker of the pickup measurement
is ``python -m bench.latency listen-worker``.)
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from sqla_jobs.db.urls import libpq_conninfo

from . import baseline
from .procs import cpu_seconds, memory_kb


def say(obj: object) -> None:
    print(obj if isinstance(obj, str) else json.dumps(obj), flush=True)


def wait_for(word: str) -> None:
    for line in sys.stdin:
        if line.strip() == word:
            return
    # stdin closed: the parent is gone, stop too.


def worker(args: argparse.Namespace) -> dict[str, Any]:
    if args.impl == "sqla":
        from sqla_jobs.worker.facade import Worker
        from sqla_jobs.worker.heap import tune_worker_heap

        from .app import LIMITED, make_jobs, write_jobs

        limit: dict[str, Any] = {"rate_limit": LIMITED} if args.rate_limited else {}
        jobs, maker = (
            (make_jobs(concurrency_limit=args.concurrency_limit, **limit), None)
            if args.handler is None
            else write_jobs(args.handler, args.url, args.loops)
        )
        w = Worker(
            jobs,
            args.url,
            concurrency=args.loops,
            poll_interval=args.poll,
            batch_size=args.batch_size,
            # The benchmarks measure pruning on their own (bench/prune.py), never by chance.
            retention=None,
            sessionmaker=maker,
        )
        errors: list[str] = []

        def run() -> None:
            try:
                w.run_sync(install_signal_handlers=False)
            except BaseException as exc:
                errors.append(repr(exc))

        thread = threading.Thread(target=run, name="sqla-jobs-worker")
        tune_worker_heap()  # what `sqla-jobs worker` does before it runs the worker
        say("ready")
        wait_for("go")
        thread.start()
        wait_for("stop")
        w.stop()
        thread.join(60)
        return {"done": w.counts["done"], "counts": w.counts, "errors": errors}
    loops = baseline.Loops(libpq_conninfo(args.url), args.loops, batched=args.impl == "batched")
    say("ready")
    wait_for("go")
    loops.start()
    wait_for("stop")
    return {"done": loops.stop(), "errors": []}


def enqueue_many(args: argparse.Namespace) -> dict[str, Any]:
    from sqlalchemy.orm import Session

    from .app import Ping, make_engine, make_jobs

    jobs = make_jobs()
    engine = make_engine(args.url)
    with Session(engine) as s:  # connect first: the pool is not what is measured
        s.connection()
    start_kb = memory_kb()["VmRSS"]
    payloads = [Ping(n=i) for i in range(args.jobs)]
    payloads_kb = memory_kb()["VmRSS"]
    t0 = time.perf_counter()
    with Session(engine) as s, s.begin():
        ids = jobs.enqueue_many(s, payloads)
    seconds = time.perf_counter() - t0
    assert len(ids) == args.jobs
    mem = memory_kb()
    return {
        "start_kb": start_kb,
        "payloads_kb": payloads_kb,
        "end_kb": mem["VmRSS"],
        "hwm_kb": mem["VmHWM"],
        "seconds": seconds,
    }


def copy(args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    from .app import KIND, payload_dict

    with psycopg.connect(libpq_conninfo(args.url)) as conn:
        start_kb = memory_kb()["VmRSS"]
        payloads = [payload_dict(i) for i in range(args.jobs)]
        payloads_kb = memory_kb()["VmRSS"]
        t0 = time.perf_counter()
        baseline.copy_jobs(conn, KIND, payloads)
        seconds = time.perf_counter() - t0
    mem = memory_kb()
    return {
        "start_kb": start_kb,
        "payloads_kb": payloads_kb,
        "end_kb": mem["VmRSS"],
        "hwm_kb": mem["VmHWM"],
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.child")
    sub = parser.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--impl", choices=("sqla", "single", "batched"), required=True)
    w.add_argument("--url", required=True)
    w.add_argument("--loops", type=int, required=True)
    w.add_argument("--poll", type=float, default=1.0)
    w.add_argument("--batch-size", type=int, default=None)
    w.add_argument(
        "--concurrency-limit",
        type=int,
        default=None,
        help="with --impl sqla: the ping kind's limit per key (the key given at enqueue)",
    )
    w.add_argument(
        "--rate-limited",
        action="store_true",
        help="with --impl sqla: the ping kind under bench.app.LIMITED (never reached)",
    )
    w.add_argument(
        "--handler",
        default=None,
        help="with --impl sqla: one of bench.app.HANDLERS (default: the async no-op)",
    )
    for name in ("enqueue-many", "copy"):
        p = sub.add_parser(name)
        p.add_argument("--url", required=True)
        p.add_argument("--jobs", type=int, required=True)
    args = parser.parse_args(argv)
    run = {
        "worker": worker,
        "enqueue-many": enqueue_many,
        "copy": copy,
    }[args.mode]
    result = run(args)
    mem = memory_kb()
    result.update(rss_kb=mem.get("VmRSS"), hwm_kb_exit=mem.get("VmHWM"), cpu_s=cpu_seconds())
    say(result)


if __name__ == "__main__":
    main()
