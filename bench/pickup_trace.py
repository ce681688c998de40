"""Where a pickup's time goes: timestamps along the path from the enqueuing COMMIT to the handler.

Not part of ``python -m bench``'s table: a diagnostic run by hand, ``python -m bench.pickup_trace
[--jobs 200] [--gap 0.02] [--modes after_commit,in_transaction]``, against ``DATABASE_URL``.
It runs the pickup measurement's shape (an idle listening worker in a child process, one job per
Session transaction, ``--gap`` apart) with the library's functions wrapped to record
``time.perf_counter_ns()`` (``CLOCK_MONOTONIC``: one clock for every process of the machine):

- in the enqueuer: the Session's ``after_commit`` (the COMMIT has returned), the notifier's
  ``send`` returning (its statement written to the socket), the notifier thread reading the
  answer, and the enqueue returning (the pickup measurement's "commit returned");
- in the worker: the listener handing a notification to the worker, the claim on the LISTEN
  connection starting and ending, the event loop taking the claimed jobs, the handler starting.

``in_transaction`` runs unthrottled here (every commit carries its NOTIFY), so it is the same
worker woken by a NOTIFY inside the enqueuing transaction: the reference of the pickup target.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import threading
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from .app import Ping, make_engine, make_jobs
from .child import say, wait_for
from .dbs import connect, fresh_database, wait_empty
from .procs import Child, Children

WARMUP = 10
ns = time.perf_counter_ns


def _worker(url: str, wakeup: str, poll: float | None) -> None:
    from sqla_jobs.worker import handoff as _handoff
    from sqla_jobs.worker import listener as _listener
    from sqla_jobs.worker.facade import Worker

    marks: dict[str, list[int]] = {
        k: [] for k in ("note", "claim0", "claim1", "loop", "start", "gc0", "gc1")
    }
    gcs: list[tuple[int, int, int]] = []  # (generation, start ns, end ns)

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            marks["gc0"].append(ns())
        else:
            gcs.append((info["generation"], marks["gc0"][-1], ns()))

    gc.callbacks.append(on_gc)
    note, on_notify, deliver = (
        _listener.Listener._note,
        _handoff.Handoff.on_notify,
        _handoff.Handoff._deliver,
    )

    def note_(self: Any, n: Any) -> None:
        marks["note"].append(ns())
        note(self, n)

    def on_notify_(self: Any, conn: Any, queues: list[str]) -> None:
        if queues:
            marks["claim0"].append(ns())
        on_notify(self, conn, queues)
        if queues:
            marks["claim1"].append(ns())

    def deliver_(self: Any, *args: Any) -> None:
        marks["loop"].append(ns())
        deliver(self, *args)

    _listener.Listener._note = note_  # type: ignore[method-assign]
    _handoff.Handoff.on_notify = on_notify_  # type: ignore[method-assign]
    _handoff.Handoff._deliver = deliver_  # type: ignore[method-assign]

    async def record(payload: Ping, ctx: object) -> None:
        marks["start"].append(ns())

    kwargs: dict[str, Any] = {} if poll is None else {"poll_interval": poll}
    w = Worker(make_jobs(record, wakeup=wakeup), url, concurrency=4, retention=None, **kwargs)
    thread = threading.Thread(target=w.run_sync, kwargs={"install_signal_handlers": False})
    say("ready")
    wait_for("go")
    thread.start()
    while w.listener is None or w.listener.connects < 1:
        time.sleep(0.005)
    say("listening")
    wait_for("stop")
    w.stop()
    thread.join(30)
    marks["gc0"] = [t0 for g, t0, t1 in gcs if t1 - t0 > 1_000_000]
    marks["gc1"] = [t1 for g, t0, t1 in gcs if t1 - t0 > 1_000_000]
    marks["gcgen"] = [g for g, t0, t1 in gcs if t1 - t0 > 1_000_000]
    say(marks)


def trace(url: str, wakeup: str, n: int, gap: float, poll: float | None) -> dict[str, list[int]]:
    """Enqueue ``n`` jobs ``gap`` apart to an idle listening worker; every mark, per kind."""
    from sqla_jobs.enqueue import notifier_thread as _nt
    from sqla_jobs.enqueue import wakeup as _wakeup

    marks: dict[str, list[int]] = {k: [] for k in ("begin", "hook", "sent", "answer", "returned")}
    send, answered, throttle = _nt.Notifier.send, _nt.Notifier._answered, _wakeup.THROTTLE

    def send_(self: Any, wakeups: Any) -> None:
        send(self, wakeups)
        marks["sent"].append(ns())

    def answered_(self: Any, pgconn: Any) -> None:
        marks["answer"].append(ns())
        answered(self, pgconn)

    def hook(session: Session) -> None:
        marks["hook"].append(ns())

    _nt.Notifier.send = send_  # type: ignore[method-assign]
    _nt.Notifier._answered = answered_  # type: ignore[method-assign]
    _wakeup.THROTTLE = 0.0
    event.listen(Session, "after_commit", hook, insert=True)
    jobs, engine = make_jobs(wakeup=wakeup), make_engine(url)
    try:
        with Children() as children, connect(url) as conn:
            polling = () if poll is None else ("--poll", str(poll))
            child = Child(
                "worker", "--url", url, "--wakeup", wakeup, *polling, module="bench.pickup_trace"
            )
            children.items.append(child)
            child.wait_ready()
            child.go()
            child.expect("listening")
            tick = time.perf_counter()
            for i in range(-WARMUP, n):
                if i == 0:
                    wait_empty(conn, "sqla_jobs_job", timeout=10)
                    for v in marks.values():
                        v.clear()
                    tick = time.perf_counter()
                marks["begin"].append(ns())
                with Session(engine) as s, s.begin():
                    jobs.enqueue(s, Ping(n=i))
                marks["returned"].append(ns())
                tick += gap
                time.sleep(max(0.0, tick - time.perf_counter()))
            wait_empty(conn, "sqla_jobs_job", timeout=10)
            time.sleep(0.1)
            theirs = child.finish()
    finally:
        engine.dispose()
        event.remove(Session, "after_commit", hook)
        _nt.Notifier.send, _nt.Notifier._answered = send, answered  # type: ignore[method-assign]
        _wakeup.THROTTLE = throttle
    begin0 = marks["begin"][0]
    # The worker's marks of the warm-up come first; keep those after the first timed commit.
    for k, v in theirs.items():
        if k == "gcgen":
            continue
        marks[k] = [t for t in v if t >= begin0]
    return marks


def per_job(marks: dict[str, list[int]]) -> list[dict[str, int]]:
    """Each mark assigned to the job whose ``begin`` it follows (one job at a time)."""
    begins = marks["begin"]
    jobs: list[dict[str, int]] = [{"begin": b} for b in begins]
    for kind, times in marks.items():
        if kind == "begin":
            continue
        j = 0
        for t in times:
            while j + 1 < len(begins) and begins[j + 1] <= t:
                j += 1
            jobs[j].setdefault(kind, t)
    return jobs


SEGMENTS = (
    ("COMMIT returned -> after_commit hook", "hook", "hook"),
    ("after_commit hook -> notifier send written", "hook", "sent"),
    ("send written -> enqueue returned", "sent", "returned"),
    ("send written -> notifier read its answer", "sent", "answer"),
    ("enqueue returned -> listener got the NOTIFY", "returned", "note"),
    ("hook -> listener got the NOTIFY", "hook", "note"),
    ("listener -> claim starts", "note", "claim0"),
    ("claim (on the LISTEN connection)", "claim0", "claim1"),
    ("claim ended -> event loop took the jobs", "claim1", "loop"),
    ("event loop -> handler started", "loop", "start"),
    ("pickup: enqueue returned -> handler started", "returned", "start"),
)


def report(mode: str, jobs: list[dict[str, int]]) -> None:
    print(f"\n{mode}: {len(jobs)} jobs, medians (p90) in us")
    for label, a, b in SEGMENTS:
        if a == b:
            continue
        d = [(j[b] - j[a]) / 1000 for j in jobs if a in j and b in j]
        if not d:
            continue
        d.sort()
        p90 = d[min(len(d) - 1, int(len(d) * 0.9))]
        print(f"  {label:48s} {statistics.median(d):8.0f} ({p90:.0f})  n={len(d)}")
    slow = sorted(
        (j for j in jobs if "returned" in j and "start" in j),
        key=lambda j: j["start"] - j["returned"],
    )[-4:]
    for j in slow:
        i = jobs.index(j)
        parts = " ".join(
            f"{b}={(j[b] - j[a]) / 1000:.0f}"
            for _, a, b in SEGMENTS
            if a in j and b in j and a != b
        )
        gc_ = f" gc={(j['gc1'] - j['gc0']) / 1000:.0f}us" if "gc0" in j and "gc1" in j else ""
        print(f"  slow job {i}: {(j['start'] - j['returned']) / 1000:.0f} us: {parts}{gc_}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pickup_trace")
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--wakeup", required=True)
    w.add_argument("--poll", type=float, default=None)
    parser.add_argument("--poll", type=float, default=None, help="the worker's poll interval")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--modes", default="after_commit,in_transaction")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if args.cmd == "worker":
        _worker(args.url, args.wakeup, args.poll)
        return
    server = os.environ["DATABASE_URL"]
    for rep in range(args.repeat):
        for mode in args.modes.split(","):
            with fresh_database(server, "sqla_jobs") as url:
                report(
                    f"{mode} rep {rep + 1}",
                    per_job(trace(url, mode, args.jobs, args.gap, args.poll)),
                )


if __name__ == "__main__":
    main()
