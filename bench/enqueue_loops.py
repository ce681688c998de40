"""The one-transaction-per-job loops of :mod:`bench.enqueue`, and how they are timed together.

A loop is a generator (:data:`Loop`): its first ``next()`` sets it up and warms it, each
``send(count)`` runs ``count`` more transactions and yields the seconds they took, closing it tears
it down. :func:`interleaved` runs several at once, each in a database of its own, a block at a time
in turns: a repetition's loops share its minutes, so a machine that drifts over them (the 2-core
host's throughput moves by 10% within a minute) reaches every loop alike, and the ratio of two
loops of one repetition measures the code rather than the minute each ran in.

Payload objects are built before the clock starts (they are the caller's input); serializing them
is timed on both sides.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import time
from collections.abc import Callable, Generator, Sequence
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

#: A one-transaction-per-job loop (see the module's docstring).
Loop = Generator[float, int, None]
#: Blocks a loop's transactions of one repetition are cut into, run in turns with the others'.
BLOCKS = 10

WARMUP = 50


def _session_loop(url: str, body: Callable[[Session, int], object]) -> Loop:
    """Runs of ``body(session, i)``, each in its own ``Session`` and transaction (one pool
    checkout, BEGIN, the body, COMMIT, close), ``i`` counting up from 0, after a warm-up with
    negative ``i``."""
    engine = make_engine(url)
    try:
        for i in range(WARMUP):
            with Session(engine) as s, s.begin():
                body(s, -i - 1)
        done = 0
        count = yield 0.0
        while True:
            t0 = time.perf_counter()
            for i in range(done, done + count):
                with Session(engine) as s, s.begin():
                    body(s, i)
            done += count
            count = yield time.perf_counter() - t0
    finally:
        # The last wakeups sent before the database is dropped, not lost with it (a warning).
        notifier.flush_all()
        engine.dispose()


def single_sqla(url: str, n: int, wakeup: str | None = None) -> Loop:
    """One ``jobs.enqueue`` per Session transaction (``wakeup``: the ``Jobs`` mode; None: the
    default)."""
    jobs = make_jobs()
    if wakeup is not None:
        jobs = Jobs(wakeup=wakeup)  # type: ignore[arg-type]
        jobs.register(KIND, Ping)
    payloads = [Ping(n=i) for i in range(n)]
    return _session_loop(url, lambda s, i: jobs.enqueue(s, payloads[i] if i >= 0 else Ping(n=i)))


def single_unique(url: str, n: int) -> Loop:
    """:func:`single_sqla` for a unique kind (every key new): ``INSERT ... ON CONFLICT`` on the
    unique index, its separate NOTIFY, the key computed from the payload."""
    jobs = make_unique_jobs()
    payloads = [UniquePing(n=i) for i in range(n)]
    return _session_loop(
        url, lambda s, i: jobs.enqueue(s, payloads[i] if i >= 0 else UniquePing(n=i))
    )


def session_floor(url: str, n: int) -> Loop:
    """The least any enqueue through a ``Session`` can cost: the same loop as
    :func:`single_sqla`, with a ``SELECT 1`` where the enqueue was. A read-only commit skips the
    WAL flush, so this is a loose bound; :func:`session_insert_floor` is the tight one."""
    one = select(literal(1))
    return _session_loop(url, lambda s, i: s.execute(one).one())


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


def session_insert_floor(url: str, n: int) -> Loop:
    """The least an enqueue through a ``Session`` costs once it writes: the same loop as
    :func:`single_sqla`, sending the enqueue's own INSERT (with its NOTIFY) as precompiled SQL
    through ``exec_driver_sql``, with no validation, no compile and no ``Job`` built. What is left
    over the raw INSERT+COMMIT is the Session and SQLAlchemy's execute path around one write."""
    sql, params = _enqueue_insert()
    texts = [json.dumps(payload_dict(i)) for i in range(n)]

    def insert(s: Session, i: int) -> object:
        payload = texts[i] if i >= 0 else json.dumps(payload_dict(i))
        return s.connection().exec_driver_sql(sql, {**params, "payload": payload}).one()

    return _session_loop(url, insert)


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


def session_core_floor(url: str, n: int) -> Loop:
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

    return _session_loop(url, insert_row)


def _raw_loop(url: str, n: int, *, autocommit: bool) -> Loop:
    sql, params = _enqueue_insert()
    texts = [json.dumps(payload_dict(i)) for i in range(n)]
    with psycopg.connect(libpq_conninfo(url), autocommit=autocommit) as conn:

        def one(payload: str) -> None:
            conn.execute(sql, {**params, "payload": payload}).fetchone()
            if not autocommit:
                conn.commit()

        for i in range(WARMUP):
            one(json.dumps(payload_dict(-i - 1)))
        yield from _timed(lambda i: one(texts[i]))


def raw_transaction(url: str, n: int) -> Loop:
    """The enqueue's INSERT (with its NOTIFY) on a raw psycopg connection: BEGIN, INSERT, COMMIT,
    the same three round trips a Session makes."""
    return _raw_loop(url, n, autocommit=False)


def raw_autocommit(url: str, n: int) -> Loop:
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


def _business_loop(url: str, body: Callable[[Session, int], object]) -> Loop:
    engine = make_engine(url)
    _Base.metadata.create_all(engine)
    engine.dispose()
    return _session_loop(url, body)


def business_job(url: str, n: int) -> Loop:
    """A business transaction: one ORM row added, and the job enqueued beside it."""
    jobs = make_jobs()
    payloads = [Ping(n=i) for i in range(n)]

    def body(s: Session, i: int) -> object:
        s.add(Order(n=i, note="bench"))
        return jobs.enqueue(s, payloads[i] if i >= 0 else Ping(n=i))

    return _business_loop(url, body)


def business_row(url: str, n: int) -> Loop:
    """:func:`business_job` with one more ORM row (of another table) in place of the job."""

    def body(s: Session, i: int) -> object:
        s.add(Order(n=i, note="bench"))
        s.add(OrderEvent(n=i, payload=payload_dict(i)))
        return None

    return _business_loop(url, body)


def single_baseline(url: str, n: int) -> Loop:
    with psycopg.connect(libpq_conninfo(url)) as conn:
        for i in range(WARMUP):
            baseline.insert_one(conn, KIND, payload_dict(-i))
        payloads = [payload_dict(i) for i in range(n)]
        yield from _timed(lambda i: baseline.insert_one(conn, KIND, payloads[i]))


#: The one-transaction-per-job loops, each in a database of its own.
SINGLE: dict[str, tuple[Subject, Callable[[str, int], Loop]]] = {
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


def _timed(one: Callable[[int], object]) -> Loop:
    """The :data:`Loop` protocol around ``one(i)``, ``i`` counting up from 0."""
    done = 0
    count = yield 0.0
    while True:
        t0 = time.perf_counter()
        for i in range(done, done + count):
            one(i)
        done += count
        count = yield time.perf_counter() - t0


def interleaved(
    server_url: str, names: Sequence[str], n: int, *, blocks: int = BLOCKS, first: int = 0
) -> dict[str, float]:
    """One repetition of the ``names`` loops of :data:`SINGLE`, ``n`` transactions each: set up
    in databases of their own, then run ``n / blocks`` transactions at a time in turns, the
    order rotated each block (starting at ``first``). Returns each loop's transactions per
    second over its ``n``."""
    with contextlib.ExitStack() as stack:
        loops: dict[str, Loop] = {}
        for name in names:
            subject, make = SINGLE[name]
            url = stack.enter_context(fresh_database(server_url, subject))
            loop = make(url, n)
            next(loop)
            stack.callback(loop.close)  # before its database is dropped
            loops[name] = loop
        spent = dict.fromkeys(names, 0.0)
        for block in range(blocks):
            size = n // blocks + (block < n % blocks)
            shift = (first + block) % len(names)
            for name in [*names[shift:], *names[:shift]]:
                spent[name] += loops[name].send(size)
    return {name: n / spent[name] for name in names}
