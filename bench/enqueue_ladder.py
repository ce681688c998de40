"""Where one enqueue's time goes, a step at a time from the Session Core floor:
``python -m bench.enqueue_ladder [--n 2000] [--repeat 4]``.

Each step is the Session loop of :mod:`bench.enqueue` (one transaction per job) with one more part
of ``jobs.enqueue`` than the step before, so the ratio between two neighbours is what that part
costs in place, caches as cold as the real enqueue leaves them (a part timed alone in a tight loop
costs three to five times less):

- ``core``: the Session Core floor (:func:`bench.enqueue_loops.session_core_floor`);
- ``statement``: the enqueue's own INSERT through ``Session.connection`` and, as the enqueue sends
  it, the driver's cursor (:mod:`sqla_jobs.db.direct`), the payload serialised by ``json.dumps``;
- ``job``: and the ``Job`` built from it and attached to the Session (``insert._attach``), which
  the commit then expires;
- ``validated``: and the payload validated and dumped by ``validate.serialize``;
- ``planned``: the whole plan of the call (``Jobs._plan_one``) in place of that;
- ``enqueue_none``: ``jobs.enqueue`` with ``wakeup="none"``;
- ``enqueue``: ``jobs.enqueue`` as shipped (the after-commit notifier).

All steps run in one fresh database, in an order rotated each repetition; prints each step's
median txn/s and process CPU per transaction (every thread's), and the median of its
same-repetition ratios against ``core`` and against the step before. The server is
``DATABASE_URL``'s (else an embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from devdb import database_url
from sqla_jobs import Jobs
from sqla_jobs.db import direct
from sqla_jobs.enqueue import insert as _insert
from sqla_jobs.enqueue import notifier
from sqla_jobs.enqueue import validate as _validate
from sqla_jobs.sql.columns import NAMES

from .app import KIND, Ping, make_engine, make_jobs, payload_dict
from .dbs import fresh_database
from .enqueue_loops import CORE_ROW, core_insert

WARMUP = 50
Step = Callable[[Session, int], object]


def steps() -> dict[str, Step]:
    """The steps, in ladder order."""
    core_stmt = core_insert()
    row = CORE_ROW
    jobs = make_jobs()
    jobs_none = Jobs(wakeup="none")
    jobs_none.register(KIND, Ping)
    kind = jobs.by_model(Ping)

    def execute(s: Session, payload: str) -> tuple[list[Any], Any]:
        """The enqueue's INSERT of ``payload``: the row's values and what it returned."""
        params = {**row, "payload": payload, "run_at": None, "delay_us": 0}
        conn = s.connection(bind_arguments=_insert._JOB_BIND)
        filled = direct.first(conn, _insert._INSERT_ONE_LEAN, params, None)
        return [params.get(name) for name in NAMES], filled

    def attach(s: Session, payload: str) -> object:
        values, filled = execute(s, payload)
        return _insert._attach(s, values, filled)

    def core(s: Session, i: int) -> object:
        return s.execute(core_stmt, {**row, "payload": payload_dict(i)}).one()

    def statement(s: Session, i: int) -> object:
        return execute(s, json.dumps(payload_dict(i)))[1]

    def job(s: Session, i: int) -> object:
        return attach(s, json.dumps(payload_dict(i)))

    def validated(s: Session, i: int) -> object:
        _model, text = _validate.serialize(kind, Ping(n=i), 1 << 20)
        return attach(s, text)

    def planned(s: Session, i: int) -> object:
        plan = jobs_none._plan_one(
            Ping(n=i), None, None, None, None, None, None, None, None, None, "skip", None
        )
        return attach(s, plan[0].payload)

    def enqueue_none(s: Session, i: int) -> object:
        return jobs_none.enqueue(s, Ping(n=i))

    def enqueue(s: Session, i: int) -> object:
        return jobs.enqueue(s, Ping(n=i))

    return {
        "core": core,
        "statement": statement,
        "job": job,
        "validated": validated,
        "planned": planned,
        "enqueue_none": enqueue_none,
        "enqueue": enqueue,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.enqueue_ladder", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="transactions per step and repetition")
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args(argv)
    ladder = steps()
    names = list(ladder)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    with database_url() as server, fresh_database(server, "sqla_jobs") as url:
        engine = make_engine(url)
        try:
            for name in names:
                for i in range(WARMUP):
                    with Session(engine) as s, s.begin():
                        ladder[name](s, -i - 1)
            for rep in range(args.repeat):
                shift = rep % len(names)
                for name in names[shift:] + names[:shift]:
                    body = ladder[name]
                    cpu, t0 = time.process_time(), time.perf_counter()
                    for i in range(args.n):
                        with Session(engine) as s, s.begin():
                            body(s, i)
                    rates[name].append(args.n / (time.perf_counter() - t0))
                    cpus[name].append((time.process_time() - cpu) / args.n * 1e6)
        finally:
            # The last wakeups sent before the database is dropped, not lost with it (a warning).
            notifier.flush_all()
            engine.dispose()
    previous = names[0]
    for name in names:
        vs_core = [a / b for a, b in zip(rates[name], rates["core"], strict=True)]
        vs_prev = [a / b for a, b in zip(rates[name], rates[previous], strict=True)]
        print(
            f"{name:>13}: {statistics.median(rates[name]):6,.0f} txn/s "
            f"{statistics.median(cpus[name]):5.0f} us CPU/txn  "
            f"vs core {statistics.median(vs_core):.3f}x  "
            f"vs {previous} {statistics.median(vs_prev):.3f}x "
            f"[{min(vs_prev):.2f}-{max(vs_prev):.2f}]"
        )
        previous = name if name != "validated" else "job"
    return 0


if __name__ == "__main__":
    sys.exit(main())
