"""Where a worker's start goes: milliseconds from ``Worker.run_sync`` to its first handler start.

Not part of ``python -m bench``'s table: a diagnostic run by hand, ``python -m bench.start_trace
[--jobs 20000] [--repeat 5]``, against ``DATABASE_URL``. Each repetition fills a fresh database
with ``--jobs`` no-op jobs and starts a worker (concurrency 4) in this process, with the library's
functions wrapped to record ``time.perf_counter()``: each asyncio connection opened (by role), the
registry row, the threads' start, the first poll's probe, the first claims, and the first handler
start, its 1,000th and its 4,000th. The drain's 20,000 jobs take about 0.3 s, so a start's
milliseconds show in its rate.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from sqla_jobs.db.connections import Connector
from sqla_jobs.worker import facade, lanes, monitor

from .app import Ping, make_jobs, prefill
from .dbs import fresh_database

#: The first claims traced (a drain's later claims are its steady state).
CLAIMS = 3
#: The handler starts marked: the first, and how soon the drain is under way.
MILESTONES = (1, 1000, 4000)


class Timeline:
    """Marks in milliseconds since the worker was started."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.marks: list[tuple[float, str]] = []

    def mark(self, what: str) -> None:
        self.marks.append(((time.perf_counter() - self.t0) * 1000.0, what))

    def first(self, what: str) -> float:
        return next(t for t, w in self.marks if w == what)


def _wrap_async(
    owner: Any, name: str, label: Callable[..., str | None], line: list[Timeline]
) -> Callable[[], None]:
    """Wrap the coroutine method ``owner.name`` to mark its start and end; returns the undo."""
    original = getattr(owner, name)

    async def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        what = label(self, *args, **kwargs)
        if what is not None:
            line[0].mark(f"{what} sent")
        result = await original(self, *args, **kwargs)
        if what is not None:
            line[0].mark(f"{what} answered")
        return result

    setattr(owner, name, wrapped)
    return lambda: setattr(owner, name, original)


def trace_one(server: str, jobs: int) -> Timeline:
    """One start on a backlog of ``jobs``; the worker is stopped once it started the last of
    :data:`MILESTONES`."""
    line = [Timeline()]
    claims = [0]

    def claim_label(self: Any, *args: Any, **kwargs: Any) -> str | None:
        claims[0] += 1
        return f"claim {claims[0]}" if claims[0] <= CLAIMS else None

    undo = [
        _wrap_async(Connector, "aconnect", lambda self, role, **kw: f"connect {role}", line),
        _wrap_async(lanes.Lanes, "claimable", lambda self, lane: "probe", line),
        _wrap_async(lanes.Lanes, "write_and_claim", claim_label, line),
        _wrap_async(monitor.Monitor, "join", lambda self, conn: "registry row", line),
    ]
    start_threads = facade.Worker._start_threads

    def threads(self: facade.Worker) -> None:
        line[0].mark("threads starting")
        start_threads(self)
        line[0].mark("threads started")

    facade.Worker._start_threads = threads  # type: ignore[method-assign]
    handled = threading.Event()
    count = [0]

    async def handler(args: Ping, ctx: object) -> None:
        count[0] += 1
        if count[0] in MILESTONES:
            line[0].mark(f"handler {count[0]}")
            if count[0] == MILESTONES[-1]:
                handled.set()

    try:
        with fresh_database(server, "sqla_jobs") as url:
            prefill("sqla_jobs", url, jobs)
            worker = facade.Worker(
                make_jobs(handler), url, concurrency=4, poll_interval=1.0, retention=None
            )

            def stop() -> None:
                handled.wait(60)
                worker.stop()

            stopper = threading.Thread(target=stop)
            stopper.start()
            line[0] = Timeline()
            worker.run_sync(install_signal_handlers=False)
            stopper.join()
    finally:
        for each in undo:
            each()
        facade.Worker._start_threads = start_threads  # type: ignore[method-assign]
    return line[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.start_trace", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    # The stop gives the rest of the backlog back, which the worker logs: not the trace's.
    logging.getLogger("sqla_jobs").setLevel(logging.ERROR)
    server = os.environ["DATABASE_URL"]
    lines = []
    for rep in range(args.repeat):
        line = trace_one(server, args.jobs)
        lines.append(line)
        print(f"rep {rep + 1}: " + " | ".join(f"{t:.1f} {w}" for t, w in line.marks), flush=True)
    for what in ("probe sent", "claim 1 answered", *(f"handler {n}" for n in MILESTONES)):
        times = [line.first(what) for line in lines]
        print(f"{what:>18}: median {statistics.median(times):5.1f} ms "
              f"[{min(times):.1f}-{max(times):.1f}]")  # fmt: skip


if __name__ == "__main__":
    main()
