"""Profile the hot paths with pyinstrument: ``python -m bench.profile enqueue|enqueue-many|drain``.

``enqueue``: one ORM transaction per job; ``enqueue-many``: one ``enqueue_many`` call; ``drain``: a
worker (in this process's main thread, stopped when the table is empty) draining pre-enqueued
no-op jobs. Prints pyinstrument's call tree and writes an HTML report under bench/results/.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from sqlalchemy.orm import Session

from devdb import database_url

from .app import Ping, make_engine, make_jobs, prefill
from .dbs import TABLE, connect, fresh_database, wait_empty

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("what", choices=("enqueue", "enqueue-many", "drain"))
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        from pyinstrument import Profiler
    except ImportError:
        raise SystemExit("pip install pyinstrument to profile") from None
    default_jobs = {"enqueue": 5_000, "enqueue-many": 100_000, "drain": 50_000}
    n = args.jobs or default_jobs[args.what]
    profiler = Profiler(interval=0.0005, async_mode="enabled")
    with database_url() as server, fresh_database(server, "sqla_jobs") as url:
        jobs = make_jobs()
        if args.what == "drain":
            from sqla_jobs.worker.facade import Worker

            prefill("sqla_jobs", url, n)
            worker = Worker(jobs, url, concurrency=args.concurrency, retention=None)

            def stop_when_empty() -> None:
                with connect(url) as conn:
                    worker.started.wait(30)
                    wait_empty(conn, TABLE["sqla_jobs"], timeout=600)
                worker.stop()

            threading.Thread(target=stop_when_empty, daemon=True).start()
            t0 = time.perf_counter()
            with profiler:
                worker.run_sync(install_signal_handlers=False)
        else:
            engine = make_engine(url)
            payloads = [Ping(n=i) for i in range(n)]
            with Session(engine) as s, s.begin():
                jobs.enqueue(s, Ping(n=-1))
            t0 = time.perf_counter()
            with profiler:
                if args.what == "enqueue":
                    for p in payloads:
                        with Session(engine) as s, s.begin():
                            jobs.enqueue(s, p)
                else:
                    with Session(engine) as s, s.begin():
                        jobs.enqueue_many(s, payloads)
            engine.dispose()
        elapsed = time.perf_counter() - t0
    print(f"{args.what}: {n:,} jobs in {elapsed:.2f} s ({n / elapsed:,.0f} jobs/s, profiled)")
    print(profiler.output_text(unicode=True, color=False, show_all=False))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"profile-{args.what}.html"
    out.write_text(profiler.output_html())
    print(f"HTML report: {out}")


if __name__ == "__main__":
    main()
