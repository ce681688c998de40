"""Pickup latency: from the enqueuing COMMIT returning to the handler starting.

The idle worker listens in a child process and its handler records the wall-clock time it starts;
this process enqueues one job at a time, a fixed gap apart, and records the wall-clock time each
COMMIT returned. Both ends run on this machine and read the same clock (``time.time``). A separate
process keeps the enqueuer off the worker's GIL.

Against the baseline the worker polls every 10 s, so NOTIFY is what delivers. Each wakeup mode of
``Jobs(wakeup=...)`` is then measured on its own, with the worker's default poll interval (what a
user gets): ``after_commit`` (the NOTIFY sent after the commit by the enqueuing process's notifier),
``in_transaction`` (in the transaction, at most once per queue per 100 ms: the jobs in between
wait for the next NOTIFY, or the poll) and ``none`` (the poll alone).

``python -m bench.latency listen-worker ...`` is the worker child (also used by
:mod:`bench.growth`, with ``--queue``).
"""

from __future__ import annotations

import argparse
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from sqla_jobs import Jobs
from sqla_jobs.db.urls import libpq_conninfo

from . import baseline
from .app import KIND, Ping, make_engine, make_jobs, payload_dict
from .child import say, wait_for
from .dbs import TABLE, Subject, connect, fresh_database, wait_empty
from .figures import Outcome, Row, Series, Target, percentile
from .procs import Child, Children, cpu_seconds
from .settings import Context

POLL = 10.0
WARMUP = 10
#: The wakeup modes of ``Jobs(wakeup=...)``, or none when this tree has no such parameter.
MODES: tuple[str, ...] = (
    ("after_commit", "in_transaction", "none")
    if "wakeup" in inspect.signature(Jobs).parameters
    else ()
)

Enqueue = Callable[[int], None]


@contextmanager
def _enqueuer(
    subject: Subject, url: str, *, wakeup: str | None = None, queue: str = "default"
) -> Iterator[Enqueue]:
    """One job per transaction: ``jobs.enqueue`` through a Session, or the doc's INSERT."""
    if subject == "sqla_jobs":
        jobs = make_jobs(wakeup=wakeup, queue=queue)
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


@contextmanager
def listening_worker(
    subject: Subject,
    url: str,
    *,
    poll: float | None = POLL,
    wakeup: str | None = None,
    queue: str = "default",
    queues: int = 1,
) -> Iterator[Child]:
    """An idle listening worker child, started and listening; ``finish()`` it for its result."""
    args = ["listen-worker", "--impl", "sqla" if subject == "sqla_jobs" else "baseline"]
    args += ["--url", url, "--queue", queue, "--queues", str(queues)]
    if poll is not None:
        args += ["--poll", str(poll)]
    if wakeup is not None:
        args += ["--wakeup", wakeup]
    with Children() as children:
        child = Child(*args, module="bench.latency")
        children.items.append(child)
        child.wait_ready()
        child.go()
        child.expect("listening")
        yield child


def latencies(
    subject: Subject,
    url: str,
    n: int,
    gap: float,
    *,
    poll: float | None = POLL,
    wakeup: str | None = None,
    queue: str = "default",
    idle_table: Callable[[psycopg.Connection[Any]], None] | None = None,
) -> tuple[list[float], int]:
    """Enqueue ``n`` jobs ``gap`` apart (after a warm-up) to an idle listening worker; return the
    latencies in ms and how many jobs never started. ``idle_table(conn)`` waits until the worker
    is idle again (default: until the queue table is empty)."""
    table = TABLE[subject]
    settle = (POLL if poll is None else poll) + 5

    def idle(conn: psycopg.Connection[Any]) -> None:
        if idle_table is not None:
            idle_table(conn)
        else:
            wait_empty(conn, table, timeout=settle)

    with (
        listening_worker(subject, url, poll=poll, wakeup=wakeup, queue=queue) as child,
        connect(url) as conn,
        _enqueuer(subject, url, wakeup=wakeup, queue=queue) as enqueue,
    ):
        for i in range(-WARMUP, 0):
            enqueue(i)
            time.sleep(gap)
        idle(conn)
        commits: dict[int, float] = {}
        tick = time.perf_counter()
        for i in range(n):
            enqueue(i)
            commits[i] = time.time()
            tick += gap
            time.sleep(max(0.0, tick - time.perf_counter()))
        try:
            idle(conn)
        except TimeoutError:
            pass
        starts = {int(k): float(v) for k, v in child.finish()["starts"].items()}
    lat = [(starts[i] - commits[i]) * 1000 for i in range(n) if i in starts]
    return lat, n - len(lat)


def _log(ctx: Context, what: str, lat: list[float], missing: int) -> None:
    ctx.log(
        f"pickup {what}: p50 {percentile(lat, 50):.2f} ms, p95 {percentile(lat, 95):.2f} ms, "
        f"p99 {percentile(lat, 99):.2f} ms, {missing} never started"
    )


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
            _log(ctx, f"{subject} rep {rep + 1}", lat, missing)
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
    rows += by_mode(ctx, raw)
    return Outcome(rows, raw)


def by_mode(ctx: Context, raw: dict[str, Any]) -> list[Row]:
    """Pickup per wakeup mode, each beside the baseline's LISTEN worker measured in the same
    repetition, the modes in a rotating order; the worker at its default poll interval."""
    if not MODES:
        ctx.log("pickup by wakeup mode: skipped, Jobs has no wakeup parameter in this tree")
        return []
    n, gap = ctx.sizes.latency_jobs, ctx.sizes.latency_gap
    who = [*MODES, "baseline"]
    pct = {m: {q: Series() for q in (50, 99)} for m in who}
    never = dict.fromkeys(who, 0)
    for rep in range(ctx.repeat):
        shift = rep % len(who)
        for mode in who[shift:] + who[:shift]:
            subject: Subject = "baseline" if mode == "baseline" else "sqla_jobs"
            with fresh_database(ctx.server_url, subject) as url:
                if mode == "baseline":
                    lat, missing = latencies(subject, url, n, gap)
                else:
                    lat, missing = latencies(subject, url, n, gap, poll=None, wakeup=mode)
            for q in (50, 99):
                pct[mode][q].add(percentile(lat, q))
            never[mode] += missing
            raw.setdefault(f"mode_{mode}", []).append({"latencies_ms": lat, "missing": missing})
            _log(ctx, f"wakeup={mode} rep {rep + 1}", lat, missing)
    rows = []
    for mode in MODES:
        for q in (50, 99):
            row = Row("pickup", f"p{q} by wakeup mode, {n} jobs {gap * 1000:g} ms apart, worker "
                      "polling every 1 s (default)", "ms", pct[mode][q], pct["baseline"][q],
                      "LISTEN worker", subject_label=f"wakeup={mode}")  # fmt: skip
            if never[mode]:
                row.note = f"{never[mode]} jobs never started"
            rows.append(row)
    return rows


# -- the worker child -------------------------------------------------------------------------


def _child(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency")
    sub = parser.add_subparsers(dest="mode", required=True)
    lw = sub.add_parser("listen-worker")
    lw.add_argument("--impl", choices=("sqla", "baseline"), required=True)
    lw.add_argument("--url", required=True)
    lw.add_argument("--poll", type=float, default=None, help="default: the Worker's")
    lw.add_argument("--wakeup", default=None)
    lw.add_argument("--queue", default="default")
    lw.add_argument("--queues", type=int, default=1, help="serve this many queues (the others "
                    "named queue1, queue2, ...)")  # fmt: skip
    args = parser.parse_args(argv)
    starts: dict[int, float] = {}
    if args.impl == "sqla":
        from sqla_jobs.worker.facade import Worker

        async def record(payload: Ping, ctx: object) -> None:
            starts[payload.n] = time.time()

        jobs = make_jobs(record, wakeup=args.wakeup, queue=args.queue)
        queues = [args.queue, *(f"{args.queue}{i}" for i in range(1, args.queues))]
        kwargs: dict[str, Any] = {} if args.poll is None else {"poll_interval": args.poll}
        w = Worker(jobs, args.url, concurrency=4, retention=None, queues=queues, **kwargs)
        thread = threading.Thread(
            target=w.run_sync, kwargs={"install_signal_handlers": False}, daemon=True
        )
        say("ready")
        wait_for("go")
        thread.start()
        deadline = time.monotonic() + 30
        while w.listener is None or w.listener.connects < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the worker did not LISTEN within 30 s")
            time.sleep(0.005)
        say("listening")
        wait_for("stop")
        w.stop()
        thread.join(30)
    else:

        def record_dict(payload: dict[str, Any]) -> None:
            starts[int(payload["n"])] = time.time()

        lw_ = baseline.ListenWorker(
            libpq_conninfo(args.url),
            poll=POLL if args.poll is None else args.poll,
            handlers={KIND: record_dict},
        )
        say("ready")
        wait_for("go")
        lw_.start()
        if not lw_.listening.wait(30):
            raise TimeoutError("the baseline worker did not LISTEN within 30 s")
        say("listening")
        wait_for("stop")
        lw_.stop()
        lw_.join(30)
    say({"starts": starts, "cpu_s": cpu_seconds()})


if __name__ == "__main__":
    _child()
