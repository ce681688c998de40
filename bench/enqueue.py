"""Enqueue throughput: one transaction per job through the ORM (the loops, and how they are timed
together, in :mod:`bench.enqueue_loops`), and one bulk ``enqueue_many``.

Against the doc's INSERT-with-NOTIFY plus COMMIT per job, and against COPY. Payload objects are
built before the clock starts (they are the caller's input); serializing them is timed on both
sides.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql import enqueue as enqueue_sql

from . import baseline
from .app import KIND, Ping, UniquePing, make_engine, make_jobs, make_unique_jobs, payload_dict
from .dbs import Subject, fresh_database
from .enqueue_loops import SINGLE, interleaved
from .figures import Outcome, Row, Series, Target
from .settings import Context


def bulk_sqla(url: str, n: int) -> float:
    jobs = make_jobs()
    engine = make_engine(url)
    try:
        with Session(engine) as s, s.begin():
            jobs.enqueue_many(s, [Ping(n=-1)])
        payloads = [Ping(n=i) for i in range(n)]
        t0 = time.perf_counter()
        with Session(engine) as s, s.begin():
            ids = jobs.enqueue_many(s, payloads)
        elapsed = time.perf_counter() - t0
        assert len(ids) == n
        return n / elapsed
    finally:
        engine.dispose()


def bulk_unique(url: str, n: int) -> float:
    """:func:`bulk_sqla` for a unique kind (every key new): one ``INSERT ... SELECT FROM unnest
    ... ON CONFLICT``, keys in order, instead of COPY."""
    jobs = make_unique_jobs()
    engine = make_engine(url)
    try:
        with Session(engine) as s, s.begin():
            jobs.enqueue_many(s, [UniquePing(n=-1)])
        payloads = [UniquePing(n=i) for i in range(n)]
        t0 = time.perf_counter()
        with Session(engine) as s, s.begin():
            ids = jobs.enqueue_many(s, payloads)
        elapsed = time.perf_counter() - t0
        assert sum(ids.inserted) == n
        return n / elapsed
    finally:
        engine.dispose()


def bulk_table_floor(url: str, n: int) -> float:
    """The baseline's COPY loop (``json.dumps`` and ``write_row`` per row, no validation) into
    ``sqla_jobs_job``, with the columns ``enqueue_many`` sends (the id from its identity). Its ratio
    to the baseline's COPY is what the table costs (its claim index, its columns). enqueue_many can
    beat it: it formats the COPY text itself and validates while the server stores rows."""
    copy_sql = f"COPY sqla_jobs_job ({', '.join(enqueue_sql.COPY_COLUMNS[1:])}) FROM STDIN"
    with psycopg.connect(libpq_conninfo(url)) as conn:
        payloads = [payload_dict(i) for i in range(n)]
        t0 = time.perf_counter()
        with conn.cursor() as cur:
            cur.execute("SELECT now()")
            row = cur.fetchone()
            assert row is not None
            # By column name: a column enqueue_many adds (rate_key did) is None here, not a shift.
            fixed = {"queue": "default", "kind": KIND, "priority": 0, "max_attempts": 10}
            fixed.update(max_crashes=3, run_at=row[0])
            columns = enqueue_sql.COPY_COLUMNS[1:]
            with cur.copy(copy_sql) as copy:
                for p in payloads:
                    fixed["payload"] = json.dumps(p)
                    copy.write_row(tuple(fixed.get(c) for c in columns))
        conn.commit()
        return n / (time.perf_counter() - t0)


def bulk_baseline(url: str, n: int) -> float:
    with psycopg.connect(libpq_conninfo(url)) as conn:
        baseline.copy_jobs(conn, KIND, [payload_dict(-1)])
        payloads = [payload_dict(i) for i in range(n)]
        t0 = time.perf_counter()
        baseline.copy_jobs(conn, KIND, payloads)
        return n / (time.perf_counter() - t0)


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    n = sizes.enqueue_single
    single = {name: Series() for name in SINGLE}
    names = list(SINGLE)
    for rep in range(ctx.repeat):
        # Every loop at once, a block at a time in turns (enqueue_loops.interleaved), who goes
        # first rotating with the repetition.
        rates = interleaved(ctx.server_url, names, n, first=rep * 3)
        for name, rate in rates.items():
            single[name].add(rate)
            ctx.log(f"enqueue {name} rep {rep + 1}: {rate:,.0f} txn/s")
    cases = {
        "bulk": (sizes.enqueue_bulk, bulk_sqla, bulk_baseline),
        "bulk_unique": (sizes.enqueue_bulk, bulk_unique, bulk_baseline),
        "bulk_floor": (sizes.enqueue_bulk, bulk_table_floor, bulk_baseline),
    }
    results = {name: {"sqla_jobs": Series(), "baseline": Series()} for name in cases}
    for rep in range(ctx.repeat):
        for name, (count, sqla_fn, base_fn) in cases.items():
            # Alternate who goes first, so a drifting machine does not favour one side.
            order: list[Subject] = (
                ["sqla_jobs", "baseline"] if rep % 2 == 0 else ["baseline", "sqla_jobs"]
            )
            for subject in order:
                fn = sqla_fn if subject == "sqla_jobs" else base_fn
                with fresh_database(ctx.server_url, subject) as url:
                    rate = fn(url, count)
                results[name][subject].add(rate)
                ctx.log(f"enqueue {name} {subject} rep {rep + 1}: {rate:,.0f} jobs/s")

    def row(name: str, label: str, unit: str, against: str, **extra: Any) -> Row:
        got = results[name]
        return Row("enqueue", label, unit, got["sqla_jobs"], got["baseline"], against, **extra)

    def pair(a: str, b: str, label: str, against: str, who: str, **extra: Any) -> Row:
        return Row(
            "enqueue", label, "txn/s", single[a], single[b], against, subject_label=who,
            paired=True, **extra,
        )  # fmt: skip

    one, bulk = f"{n:,}", f"{sizes.enqueue_bulk:,}"
    raw = "raw INSERT+COMMIT"
    rows = [
        pair("enqueue", "baseline", f"1 txn per job, {one} jobs (ORM enqueue vs INSERT+COMMIT)",
             raw, "sqla-jobs", target=Target("ratio_min", 0.7)),
        pair("enqueue", "core_floor", f"1 txn per job, {one} jobs: ORM enqueue vs the Session "
             "Core floor (a Core insert().returning(id) of the same row)", "Session + Core INSERT",
             "sqla-jobs", target=Target("ratio_min", 0.9)),
        pair("enqueue", "insert_floor", f"1 txn per job, {one} jobs: ORM enqueue vs the Session "
             "INSERT floor (the enqueue's own INSERT, precompiled)", "Session + raw INSERT",
             "sqla-jobs"),
        pair("business_job", "business_row", f"a business row + the job vs a business row + one "
             f"more ORM row, {one} txns", "business row + ORM row", "business row + enqueue",
             target=Target("ratio_min", 0.9)),
        *(
            pair(f"enqueue_{mode}", "insert_floor", f"1 txn per job, {one} jobs: ORM enqueue with "
                 f"wakeup={mode!r} vs the Session INSERT floor", "Session + raw INSERT",
                 f"sqla-jobs, wakeup={mode}")
            for mode in ("none", "in_transaction")
            if f"enqueue_{mode}" in single
        ),
        pair("unique", "baseline", f"1 txn per job, {one} unique jobs (ORM enqueue, ON CONFLICT)",
             raw, "sqla-jobs, unique kind"),
        pair("floor", "baseline", f"Session floor: SELECT 1 per Session txn, {one} (bounds the "
             "above)", raw, "Session + SELECT 1"),
        pair("insert_floor", "baseline", f"Session INSERT floor: the enqueue's INSERT via "
             f"exec_driver_sql, {one} (bounds the above)", raw, "Session + raw INSERT"),
        pair("raw_txn", "baseline", f"the enqueue's INSERT on raw psycopg, BEGIN/INSERT/COMMIT, "
             f"{one}", raw, "psycopg, 3 round trips"),
        pair("core_floor", "insert_floor", f"Session Core floor vs the Session INSERT floor, "
             f"{one} (what executing a Core statement costs)", "Session + raw INSERT",
             "Session + Core INSERT"),
        pair("insert_floor", "raw_txn", f"Session INSERT floor vs the same INSERT on raw psycopg "
             f"(BEGIN/INSERT/COMMIT), {one}", "psycopg, 3 round trips", "Session + raw INSERT"),
        pair("raw_autocommit", "raw_txn", f"the enqueue's INSERT on raw psycopg, autocommit (1 "
             f"round trip) vs BEGIN/INSERT/COMMIT, {one}", "psycopg, 3 round trips",
             "psycopg, autocommit"),
        row("bulk", f"bulk {bulk} jobs, 1 commit (enqueue_many vs COPY)", "jobs/s", "COPY",
            target=Target("ratio_min", 0.5)),
        row("bulk_unique", f"bulk {bulk} unique jobs, 1 commit (enqueue_many: INSERT ON "
            "CONFLICT vs COPY)", "jobs/s", "COPY", subject_label="sqla-jobs, unique kind"),
        row("bulk_floor", f"the baseline's COPY loop, {bulk} into the sqla-jobs table (what the "
            "table costs)", "jobs/s", "COPY", subject_label="raw COPY, sqla-jobs table"),
    ]  # fmt: skip
    return Outcome(rows, {"single": {k: v.as_dict() for k, v in single.items()}})
