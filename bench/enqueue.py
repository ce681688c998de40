"""Enqueue throughput: one transaction per job through the ORM, and one bulk ``enqueue_many``.

Against the doc's INSERT-with-NOTIFY plus COMMIT per job, and against COPY. Payload objects are
built before the clock starts (they are the caller's input); serializing them is timed on both
sides.
"""

from __future__ import annotations

import json
import time

import psycopg
from sqlalchemy import literal, select
from sqlalchemy.orm import Session

from sqla_jobs import statements
from sqla_jobs._db import libpq_conninfo
from sqla_jobs.model import notify_channel

from . import baseline
from .app import KIND, Ping, make_engine, make_jobs, payload_dict
from .dbs import Subject, fresh_database
from .figures import Outcome, Row, Series, Target
from .settings import Context

WARMUP = 50


def single_sqla(url: str, n: int) -> float:
    jobs = make_jobs()
    engine = make_engine(url)
    try:
        for i in range(WARMUP):
            with Session(engine) as s, s.begin():
                jobs.enqueue(s, Ping(n=-i))
        payloads = [Ping(n=i) for i in range(n)]
        t0 = time.perf_counter()
        for p in payloads:
            with Session(engine) as s, s.begin():
                jobs.enqueue(s, p)
        return n / (time.perf_counter() - t0)
    finally:
        engine.dispose()


def session_floor(url: str, n: int) -> float:
    """The least any enqueue through a ``Session`` can cost: the same loop as
    :func:`single_sqla`, with a ``SELECT 1`` where the enqueue was (one pool checkout, BEGIN, one
    statement, COMMIT, close). Its ratio to the raw INSERT+COMMIT bounds the ORM enqueue's."""
    engine = make_engine(url)
    one = select(literal(1))
    try:
        for _ in range(WARMUP):
            with Session(engine) as s, s.begin():
                s.execute(one).one()
        t0 = time.perf_counter()
        for _ in range(n):
            with Session(engine) as s, s.begin():
                s.execute(one).one()
        return n / (time.perf_counter() - t0)
    finally:
        engine.dispose()


def session_insert_floor(url: str, n: int) -> float:
    """The least an enqueue through a ``Session`` costs once it writes: the same loop as
    :func:`single_sqla`, sending the enqueue's own INSERT (with its NOTIFY) as precompiled SQL
    through ``exec_driver_sql``, with no validation, no compile and no ``Job`` built. What is left
    over the raw INSERT+COMMIT is the Session and SQLAlchemy's execute path around one write."""
    engine = make_engine(url)
    sql = str(statements.insert_job_and_notify().compile(dialect=engine.dialect))
    params = {
        "queue": "default",
        "kind": KIND,
        "priority": 0,
        "run_at": None,
        "delay_us": 0,
        "max_attempts": 10,
        "max_crashes": 3,
        "concurrency_key": None,
        "concurrency_limit": None,
        "channel": notify_channel(None),
        "queue_name": "default",
    }
    try:
        for i in range(WARMUP):
            with Session(engine) as s, s.begin():
                s.connection().exec_driver_sql(
                    sql, {**params, "payload": json.dumps(payload_dict(-i))}
                ).one()
        payloads = [json.dumps(payload_dict(i)) for i in range(n)]
        t0 = time.perf_counter()
        for p in payloads:
            with Session(engine) as s, s.begin():
                s.connection().exec_driver_sql(sql, {**params, "payload": p}).one()
        return n / (time.perf_counter() - t0)
    finally:
        engine.dispose()


def single_baseline(url: str, n: int) -> float:
    with psycopg.connect(libpq_conninfo(url)) as conn:
        for i in range(WARMUP):
            baseline.insert_one(conn, KIND, payload_dict(-i))
        payloads = [payload_dict(i) for i in range(n)]
        t0 = time.perf_counter()
        for p in payloads:
            baseline.insert_one(conn, KIND, p)
        return n / (time.perf_counter() - t0)


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


def bulk_table_floor(url: str, n: int) -> float:
    """The least any bulk enqueue into sqla-jobs' table can cost: the baseline's COPY loop
    (``json.dumps`` per row, no validation), into ``sqla_jobs_job`` with the columns
    ``enqueue_many`` sends (the id from its identity). Its ratio to the baseline's COPY bounds
    ``enqueue_many``'s: the difference is the table (its claim index, its columns)."""
    copy_sql = f"COPY sqla_jobs_job ({', '.join(statements.COPY_COLUMNS[1:])}) FROM STDIN"
    with psycopg.connect(libpq_conninfo(url)) as conn:
        payloads = [payload_dict(i) for i in range(n)]
        t0 = time.perf_counter()
        with conn.cursor() as cur:
            cur.execute("SELECT now()")
            row = cur.fetchone()
            assert row is not None
            with cur.copy(copy_sql) as copy:
                for p in payloads:
                    copy.write_row(("default", KIND, json.dumps(p), 0, 10, 3, None, None, row[0]))
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
    cases = {
        "single": (sizes.enqueue_single, single_sqla, single_baseline),
        "floor": (sizes.enqueue_single, session_floor, single_baseline),
        "insert_floor": (sizes.enqueue_single, session_insert_floor, single_baseline),
        "bulk": (sizes.enqueue_bulk, bulk_sqla, bulk_baseline),
        "bulk_floor": (sizes.enqueue_bulk, bulk_table_floor, bulk_baseline),
    }
    results = {name: {"sqla_jobs": Series(), "baseline": Series()} for name in cases}
    for rep in range(ctx.repeat):
        for name, (n, sqla_fn, base_fn) in cases.items():
            # Alternate who goes first, so a drifting machine does not favour one side.
            order: list[Subject] = (
                ["sqla_jobs", "baseline"] if rep % 2 == 0 else ["baseline", "sqla_jobs"]
            )
            for subject in order:
                fn = sqla_fn if subject == "sqla_jobs" else base_fn
                with fresh_database(ctx.server_url, subject) as url:
                    rate = fn(url, n)
                results[name][subject].add(rate)
                ctx.log(f"enqueue {name} {subject} rep {rep + 1}: {rate:,.0f} jobs/s")
    rows = [
        Row(
            "enqueue",
            f"1 txn per job, {sizes.enqueue_single:,} jobs (ORM enqueue vs INSERT+COMMIT)",
            "jobs/s",
            results["single"]["sqla_jobs"],
            results["single"]["baseline"],
            "raw INSERT+COMMIT",
            Target("ratio_min", 0.7),
        ),
        Row(
            "enqueue",
            f"Session floor: SELECT 1 per Session txn, {sizes.enqueue_single:,} (bounds the above)",
            "txn/s",
            results["floor"]["sqla_jobs"],
            results["floor"]["baseline"],
            "raw INSERT+COMMIT",
            subject_label="Session + SELECT 1",
        ),
        Row(
            "enqueue",
            f"Session INSERT floor: the enqueue's INSERT via exec_driver_sql, {sizes.enqueue_single:,}"
            " (bounds the above)",
            "jobs/s",
            results["insert_floor"]["sqla_jobs"],
            results["insert_floor"]["baseline"],
            "raw INSERT+COMMIT",
            subject_label="Session + raw INSERT",
        ),
        Row(
            "enqueue",
            f"bulk {sizes.enqueue_bulk:,} jobs, 1 commit (enqueue_many vs COPY)",
            "jobs/s",
            results["bulk"]["sqla_jobs"],
            results["bulk"]["baseline"],
            "COPY",
            Target("ratio_min", 0.5),
        ),
        Row(
            "enqueue",
            f"COPY floor: raw COPY of {sizes.enqueue_bulk:,} into the sqla-jobs table (bounds the above)",
            "jobs/s",
            results["bulk_floor"]["sqla_jobs"],
            results["bulk_floor"]["baseline"],
            "COPY",
            subject_label="raw COPY, sqla-jobs table",
        ),
    ]
    return Outcome(rows)
