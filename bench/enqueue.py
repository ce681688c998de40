"""Enqueue throughput: one transaction per job through the ORM, and one bulk ``enqueue_many``.

Against the doc's INSERT-with-NOTIFY plus COMMIT per job, and against COPY. Payload objects are
built before the clock starts (they are the caller's input); serializing them is timed on both
sides.
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import BigInteger, Identity, Text, insert, literal, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.sql import ClauseElement

from sqla_jobs import Jobs
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.enqueue import notifier
from sqla_jobs.model import Job, notify_channel
from sqla_jobs.sql import enqueue as enqueue_sql

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
        # The last wakeups sent before the database is dropped, not lost with it (a warning).
        notifier.flush_all()
        engine.dispose()


def single_sqla(url: str, n: int, wakeup: str | None = None) -> float:
    """One ``jobs.enqueue`` per Session transaction (``wakeup``: the ``Jobs`` mode; None: the
    default)."""
    jobs = make_jobs()
    if wakeup is not None:
        jobs = Jobs(wakeup=wakeup)  # type: ignore[arg-type]
        jobs.register(KIND, Ping)
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


#: Whether ``jobs.enqueue`` sends its NOTIFY after the commit, from a notifier of its own (the
#: ``wakeup="after_commit"`` default), rather than folded into its INSERT.
NOTIFY_AFTER_COMMIT = "wakeup" in inspect.signature(Jobs).parameters


def _enqueue_insert() -> tuple[str, dict[str, Any]]:
    """What ``jobs.enqueue`` sends in the transaction for a ``ping`` job without options: its
    INSERT (with its NOTIFY folded in, unless the NOTIFY comes after the commit), compiled for
    psycopg, and its parameters but the payload."""
    lean: ClauseElement = (
        enqueue_sql.insert_job(lean=True)
        if NOTIFY_AFTER_COMMIT
        else enqueue_sql.insert_job_and_notify(lean=True)
    )
    sql = str(lean.compile(dialect=postgresql.psycopg.dialect()))  # type: ignore[no-untyped-call]
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
    }
    if not NOTIFY_AFTER_COMMIT:
        params.update(channel=notify_channel(None), queue_name="default")
    return sql, params


def session_insert_floor(url: str, n: int) -> float:
    """The least an enqueue through a ``Session`` costs once it writes: the same loop as
    :func:`single_sqla`, sending the enqueue's own INSERT (with its NOTIFY) as precompiled SQL
    through ``exec_driver_sql``, with no validation, no compile and no ``Job`` built. What is left
    over the raw INSERT+COMMIT is the Session and SQLAlchemy's execute path around one write."""
    sql, params = _enqueue_insert()
    texts = [json.dumps(payload_dict(i)) for i in range(n)]

    def insert(s: Session, i: int) -> object:
        payload = texts[i] if i >= 0 else json.dumps(payload_dict(i))
        return s.connection().exec_driver_sql(sql, {**params, "payload": payload}).one()

    return _session_loop(url, n, insert)


#: The columns of a ``ping`` job without options that the enqueue writes, but the payload.
CORE_ROW: dict[str, Any] = {
    "queue": "default",
    "kind": KIND,
    "priority": 0,
    "max_attempts": 10,
    "max_crashes": 3,
    "concurrency_key": None,
    "concurrency_limit": None,
}


def core_insert() -> Any:
    """The Core floor's statement: ``insert(job table).returning(id)``."""
    table = Job.__table__
    return insert(table).returning(table.c.id)


def session_core_floor(url: str, n: int) -> float:
    """What an application's own insert of a row like the job's costs through a ``Session``: the
    same loop as :func:`single_sqla`, executing a Core ``insert(job table).returning(id)`` of the
    columns the enqueue writes, the payload a dict serialised by the JSONB type, through
    ``session.execute``. Unlike :func:`session_insert_floor`, it pays SQLAlchemy's statement
    execution (cache key, compiled cache, result) as the enqueue does."""
    stmt = core_insert()
    payloads = [payload_dict(i) for i in range(n)]

    def insert_row(s: Session, i: int) -> object:
        payload = payloads[i] if i >= 0 else payload_dict(i)
        return s.execute(stmt, {**CORE_ROW, "payload": payload}).one()

    return _session_loop(url, n, insert_row)


def _raw_loop(url: str, n: int, *, autocommit: bool) -> float:
    sql, params = _enqueue_insert()
    texts = [json.dumps(payload_dict(i)) for i in range(n)]
    with psycopg.connect(libpq_conninfo(url), autocommit=autocommit) as conn:

        def one(payload: str) -> None:
            conn.execute(sql, {**params, "payload": payload}).fetchone()
            if not autocommit:
                conn.commit()

        for i in range(WARMUP):
            one(json.dumps(payload_dict(-i - 1)))
        t0 = time.perf_counter()
        for text in texts:
            one(text)
        return n / (time.perf_counter() - t0)


def raw_transaction(url: str, n: int) -> float:
    """The enqueue's INSERT (with its NOTIFY) on a raw psycopg connection: BEGIN, INSERT, COMMIT,
    the same three round trips a Session makes."""
    return _raw_loop(url, n, autocommit=False)


def raw_autocommit(url: str, n: int) -> float:
    """The enqueue's INSERT on a raw autocommit psycopg connection: one round trip per job."""
    return _raw_loop(url, n, autocommit=True)


class _Base(DeclarativeBase):
    pass


class Order(_Base):
    """The business row of :func:`business_job` and :func:`business_row`."""

    __tablename__ = "bench_order"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    n: Mapped[int]
    note: Mapped[str] = mapped_column(Text)


class OrderEvent(_Base):
    """The one more ORM row of :func:`business_row`: another table, so it is its own INSERT, as
    the job's is."""

    __tablename__ = "bench_order_event"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    n: Mapped[int]
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)


def _business_loop(url: str, n: int, body: Callable[[Session, int], object]) -> float:
    engine = make_engine(url)
    _Base.metadata.create_all(engine)
    engine.dispose()
    return _session_loop(url, n, body)


def business_job(url: str, n: int) -> float:
    """A business transaction: one ORM row added, and the job enqueued beside it."""
    jobs = make_jobs()
    payloads = [Ping(n=i) for i in range(n)]

    def body(s: Session, i: int) -> object:
        s.add(Order(n=i, note="bench"))
        return jobs.enqueue(s, payloads[i] if i >= 0 else Ping(n=i))

    return _business_loop(url, n, body)


def business_row(url: str, n: int) -> float:
    """:func:`business_job` with one more ORM row (of another table) in place of the job."""

    def body(s: Session, i: int) -> object:
        s.add(Order(n=i, note="bench"))
        s.add(OrderEvent(n=i, payload=payload_dict(i)))
        return None

    return _business_loop(url, n, body)


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


#: The one-transaction-per-job loops, each timed in a database of its own, in a rotating order.
SINGLE: dict[str, tuple[Subject, Callable[[str, int], float]]] = {
    "enqueue": ("sqla_jobs", single_sqla),
    **{
        f"enqueue_{mode}": ("sqla_jobs", functools.partial(single_sqla, wakeup=mode))
        for mode in ("none", "in_transaction")
        if NOTIFY_AFTER_COMMIT
    },
    "unique": ("sqla_jobs", single_unique),
    "floor": ("sqla_jobs", session_floor),
    "insert_floor": ("sqla_jobs", session_insert_floor),
    "core_floor": ("sqla_jobs", session_core_floor),
    "raw_txn": ("sqla_jobs", raw_transaction),
    "raw_autocommit": ("sqla_jobs", raw_autocommit),
    "business_job": ("sqla_jobs", business_job),
    "business_row": ("sqla_jobs", business_row),
    "baseline": ("baseline", single_baseline),
}


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    n = sizes.enqueue_single
    single = {name: Series() for name in SINGLE}
    names = list(SINGLE)
    for rep in range(ctx.repeat):
        # Rotate who goes first, so a drifting machine does not favour one loop.
        shift = rep * 3 % len(names)
        for name in names[shift:] + names[:shift]:
            subject, fn = SINGLE[name]
            with fresh_database(ctx.server_url, subject) as url:
                rate = fn(url, n)
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
