"""Enqueue throughput: one transaction per job through the ORM, and one bulk ``enqueue_many``.

Against the doc's INSERT-with-NOTIFY plus COMMIT per job, and against COPY. Payload objects are
built before the clock starts (they are the caller's input); serializing them is timed on both
sides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import literal, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from sqla_jobs import statements
from sqla_jobs._db import libpq_conninfo
from sqla_jobs.model import notify_channel

from . import baseline
from .app import KIND, Ping, UniquePing, make_engine, make_jobs, make_unique_jobs, payload_dict
from .dbs import Subject, fresh_database
from .figures import Outcome, Row, Series, Target
from .settings import Context

WARMUP = 50


def _session_loop(url: str, n: int, body: Callable[[Session, int], object]) -> float:
    """Transactions per second of ``n`` runs of ``body(session, i)``, each in its own ``Session``
    and transaction (one pool checkout, BEGIN, the body, COMMIT, close), after a warm-up with
    negative ``i``."""
    engine = make_engine(url)
    try:
        for i in range(WARMUP):
            with Session(engine) as s, s.begin():
                body(s, -i - 1)
        t0 = time.perf_counter()
        for i in range(n):
            with Session(engine) as s, s.begin():
                body(s, i)
        return n / (time.perf_counter() - t0)
    finally:
        engine.dispose()


def single_sqla(url: str, n: int) -> float:
    jobs = make_jobs()
    payloads = [Ping(n=i) for i in range(n)]
    return _session_loop(url, n, lambda s, i: jobs.enqueue(s, payloads[i] if i >= 0 else Ping(n=i)))


def single_unique(url: str, n: int) -> float:
    """:func:`single_sqla` for a unique kind (every key new): ``INSERT ... ON CONFLICT`` on the
    unique index, its separate NOTIFY, the key computed from the payload."""
    jobs = make_unique_jobs()
    payloads = [UniquePing(n=i) for i in range(n)]
    return _session_loop(
        url, n, lambda s, i: jobs.enqueue(s, payloads[i] if i >= 0 else UniquePing(n=i))
    )


def session_floor(url: str, n: int) -> float:
    """The least any enqueue through a ``Session`` can cost: the same loop as
    :func:`single_sqla`, with a ``SELECT 1`` where the enqueue was. A read-only commit skips the
    WAL flush, so this is a loose bound; :func:`session_insert_floor` is the tight one."""
    one = select(literal(1))
    return _session_loop(url, n, lambda s, i: s.execute(one).one())


def session_insert_floor(url: str, n: int) -> float:
    """The least an enqueue through a ``Session`` costs once it writes: the same loop as
    :func:`single_sqla`, sending the enqueue's own INSERT (with its NOTIFY) as precompiled SQL
    through ``exec_driver_sql``, with no validation, no compile and no ``Job`` built. What is left
    over the raw INSERT+COMMIT is the Session and SQLAlchemy's execute path around one write."""
    # What enqueue sends for a job without meta.
    lean = statements.insert_job_and_notify(lean=True)
    sql = str(lean.compile(dialect=postgresql.psycopg.dialect()))
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
    texts = [json.dumps(payload_dict(i)) for i in range(n)]

    def insert(s: Session, i: int) -> object:
        payload = texts[i] if i >= 0 else json.dumps(payload_dict(i))
        return s.connection().exec_driver_sql(sql, {**params, "payload": payload}).one()

    return _session_loop(url, n, insert)


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
                    copy.write_row(
                        ("default", KIND, json.dumps(p), 0, 10, 3, None, None, None, row[0])
                    )
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
        "single_unique": (sizes.enqueue_single, single_unique, single_baseline),
        "floor": (sizes.enqueue_single, session_floor, single_baseline),
        "insert_floor": (sizes.enqueue_single, session_insert_floor, single_baseline),
        "bulk": (sizes.enqueue_bulk, bulk_sqla, bulk_baseline),
        "bulk_unique": (sizes.enqueue_bulk, bulk_unique, bulk_baseline),
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

    def row(name: str, label: str, unit: str, against: str, **extra: Any) -> Row:
        got = results[name]
        return Row("enqueue", label, unit, got["sqla_jobs"], got["baseline"], against, **extra)

    single, bulk = f"{sizes.enqueue_single:,}", f"{sizes.enqueue_bulk:,}"
    rows = [
        row("single", f"1 txn per job, {single} jobs (ORM enqueue vs INSERT+COMMIT)", "jobs/s",
            "raw INSERT+COMMIT", target=Target("ratio_min", 0.7)),
        row("single_unique", f"1 txn per job, {single} unique jobs (ORM enqueue, ON CONFLICT)",
            "jobs/s", "raw INSERT+COMMIT", subject_label="sqla-jobs, unique kind"),
        row("floor", f"Session floor: SELECT 1 per Session txn, {single} (bounds the above)",
            "txn/s", "raw INSERT+COMMIT", subject_label="Session + SELECT 1"),
        row("insert_floor", f"Session INSERT floor: the enqueue's INSERT via exec_driver_sql, "
            f"{single} (bounds the above)", "jobs/s", "raw INSERT+COMMIT",
            subject_label="Session + raw INSERT"),
        row("bulk", f"bulk {bulk} jobs, 1 commit (enqueue_many vs COPY)", "jobs/s", "COPY",
            target=Target("ratio_min", 0.5)),
        row("bulk_unique", f"bulk {bulk} unique jobs, 1 commit (enqueue_many: INSERT ON "
            "CONFLICT vs COPY)", "jobs/s", "COPY", subject_label="sqla-jobs, unique kind"),
        row("bulk_floor", f"the baseline's COPY loop, {bulk} into the sqla-jobs table (what the "
            "table costs)", "jobs/s", "COPY", subject_label="raw COPY, sqla-jobs table"),
    ]  # fmt: skip
    return Outcome(rows)
