"""Enqueue rides the caller's transaction: against a real PostgreSQL, never a mock.

Notifications are read without sleeping: :class:`Listener` commits a marker NOTIFY of its own and
reads until the marker arrives. Postgres delivers notifications in commit order, so everything
committed before the marker has arrived by then, and anything not yet committed has not.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel
from sqlalchemy import Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import (
    EnqueueError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidQueueNameError,
    InvalidScheduleError,
    Job,
    Jobs,
    PayloadTooLargeError,
    SqlaJobsError,
    UnknownKindError,
)
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
from sqla_jobs.enqueue import notifier as _notifier
from sqla_jobs.enqueue.insert import CHUNK, COPY_THRESHOLD, enqueue_many
from sqla_jobs.enqueue.validate import Batch, Prepared
from tests.conftest import migrated_schema

UTC = timezone.utc


class Ping(BaseModel):
    n: int


class SendEmail(BaseModel):
    to: str
    subject: str = ""


class Measure(BaseModel):
    value: float


class Keyed(BaseModel):
    c: str


class Account(BaseModel):
    account: str


def account_key(payload: Account) -> str:
    if payload.account == "explode":
        raise LookupError("no such account")
    return payload.account


class Unregistered(BaseModel):
    n: int


class PingSubclass(Ping):
    pass


JOBS = Jobs()
JOBS.register("ping", Ping)
JOBS.register("send_email", SendEmail, queue="mail", priority=-3, max_attempts=4, max_crashes=2)
JOBS.register("measure", Measure)
JOBS.register("keyed", Keyed, concurrency_limit=2)
JOBS.register("account_sync", Account, concurrency_key=account_key)

#: Just room for {"n":1234567890} (16 bytes).
SMALL_LIMIT = 16
SMALL = Jobs(max_payload_bytes=SMALL_LIMIT)
SMALL.register("ping", Ping)

ALT_SCHEMA = "sqla_jobs_alt"
ALT = Jobs(schema=ALT_SCHEMA)
ALT.register("ping", Ping)

AWARE = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
#: How long to wait for our own marker notification before declaring the listener broken.
MARKER_TIMEOUT = 10.0


# -- helpers and fixtures -------------------------------------------------------------------------


def job_ids(engine: Engine, schema: str | None = None) -> list[int]:
    """Ids of the committed jobs, read on a connection of its own."""
    table = "sqla_jobs_job" if schema is None else f'"{schema}".sqla_jobs_job'
    with engine.connect() as conn:
        return list(conn.scalars(text(f"SELECT id FROM {table} ORDER BY id")))


def committed_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        result = conn.execute(text("SELECT * FROM sqla_jobs_job ORDER BY id"))
        return [dict(row) for row in result.mappings()]


def utc_delta(later: datetime, earlier: datetime) -> timedelta:
    """The exact duration between two instants (aware datetimes that share a tzinfo subtract as
    wall-clock times, which hides DST)."""
    return later.astimezone(UTC) - earlier.astimezone(UTC)


def by_form(payloads: list[str]) -> tuple[list[str], list[str]]:
    """The wakeups to claim now (a queue's name), and the ``due QUEUE`` ones (seconds left off)."""
    plain = [p for p in payloads if not p.startswith("due ")]
    due = [p.rsplit(" ", 1)[0] for p in payloads if p.startswith("due ")]
    return plain, due


class Listener:
    """A LISTEN connection of its own on ``channel``."""

    def __init__(self, conninfo: str, channel: str) -> None:
        self.channel = channel
        self._conn = psycopg.connect(conninfo, autocommit=True)
        self._sender = psycopg.connect(conninfo, autocommit=True)
        self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        self._markers = 0

    def received(self) -> list[str]:
        """Payloads of the notifications committed on ``channel`` since the last call, in order
        (the wakeups this process's notifier was handed first: it sends them after commits)."""
        assert _notifier.flush_all(MARKER_TIMEOUT), "the notifier did not send its wakeups"
        self._markers += 1
        marker = f"test-marker-{self._markers}"
        self._sender.execute("SELECT pg_notify(%s, %s)", (self.channel, marker))
        payloads: list[str] = []
        for note in self._conn.notifies(timeout=MARKER_TIMEOUT):
            assert note.channel == self.channel
            if note.payload == marker:
                return payloads
            payloads.append(note.payload)
        raise AssertionError(
            f"marker NOTIFY on {self.channel!r} not delivered in {MARKER_TIMEOUT}s"
        )

    def close(self) -> None:
        self._conn.close()
        self._sender.close()


@pytest.fixture
def listen(migrated_url: str) -> Iterator[Callable[[str], Listener]]:
    """Open listeners on channels; all closed at the end of the test."""
    opened: list[Listener] = []

    def open_listener(channel: str) -> Listener:
        # Earlier tests' wakeups, still on their way from the notifier, are not this test's.
        assert _notifier.flush_all(MARKER_TIMEOUT)
        listener = Listener(libpq_conninfo(migrated_url), channel)
        opened.append(listener)
        return listener

    yield open_listener
    for listener in opened:
        listener.close()


@pytest.fixture
def listener(listen: Callable[[str], Listener]) -> Listener:
    """A listener on the default schema's channel."""
    return listen(JOBS.channel)


# -- the transaction decides ----------------------------------------------------------------------


def test_commit_makes_the_job_visible_to_another_connection(clean: Engine) -> None:
    with Session(clean) as session:
        job = JOBS.enqueue(session, Ping(n=1))
        job_id = job.id
        assert job_ids(clean) == []
        session.commit()
    rows = committed_rows(clean)
    assert [(r["id"], r["kind"], r["payload"], r["state"]) for r in rows] == [
        (job_id, "ping", {"n": 1}, "pending")
    ]


def test_rollback_discards_the_enqueued_job(clean: Engine) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, Ping(n=1))
        JOBS.enqueue_many(session, [Ping(n=2), Ping(n=3)])
        session.rollback()
    assert job_ids(clean) == []


def test_closing_the_session_without_commit_discards_the_job(clean: Engine) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, Ping(n=1))
    assert job_ids(clean) == []


def test_enqueue_returns_a_flushed_persistent_job_with_id_and_database_defaults(
    clean: Engine,
) -> None:
    with Session(clean) as session:
        job = JOBS.enqueue(session, Ping(n=1))
        assert isinstance(job, Job)
        assert inspect(job).persistent
        assert job in session
        assert session.get(Job, job.id) is job
        assert isinstance(job.id, int)
        assert (job.queue, job.kind, job.payload, job.state) == (
            "default",
            "ping",
            {"n": 1},
            "pending",
        )
        assert (job.priority, job.attempts, job.max_attempts, job.crashes, job.max_crashes) == (
            0,
            0,
            10,
            0,
            3,
        )
        assert job.lease_token is None
        assert job.lease_expires_at is None
        assert job.run_at == job.created_at
        assert not session.new
        assert not session.dirty
        session.rollback()


def test_the_returned_job_is_attached_with_the_events_session_add_fires(clean: Engine) -> None:
    """The Job enqueue builds enters the Session as a detached object added to it would: the
    application's attach listeners see it, once, persistent, and the next flush has nothing to
    write for it."""
    seen: list[tuple[str, object]] = []
    with Session(clean) as session:
        for name in ("before_attach", "after_attach", "detached_to_persistent"):
            event.listen(session, name, lambda s, obj, name=name: seen.append((name, obj)))
        job = JOBS.enqueue(session, Ping(n=1))
        assert seen == [
            ("before_attach", job),
            ("after_attach", job),
            ("detached_to_persistent", job),
        ]
        assert inspect(job).persistent
        assert not inspect(job).modified
        assert not inspect(job).unloaded
        job_id = job.id
        assert inspect(job).identity == (job_id,)
        session.flush()
        session.commit()
    assert job_ids(clean) == [job_id]


def test_enqueue_stores_the_kind_string_and_the_kinds_options(clean: Engine) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, SendEmail(to="a@example.com"))
        session.commit()
    [row] = committed_rows(clean)
    assert row["kind"] == "send_email"
    assert row["payload"] == {"to": "a@example.com", "subject": ""}
    assert (row["queue"], row["priority"], row["max_attempts"], row["max_crashes"]) == (
        "mail",
        -3,
        4,
        2,
    )


def test_enqueue_stores_the_concurrency_key_and_limit(clean: Engine) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, Account(account="acme"))
        JOBS.enqueue(session, Keyed(c="x"), concurrency_key="tenant:1")
        JOBS.enqueue(session, Ping(n=1))
        JOBS.enqueue_many(session, [Account(account="initech"), Ping(n=2)])
        session.commit()
    rows = committed_rows(clean)
    assert [(r["concurrency_key"], r["concurrency_limit"]) for r in rows] == [
        ("acme", 1),
        ("tenant:1", 2),
        (None, None),
        ("initech", 1),
        (None, None),
    ]


def test_enqueue_options_override_the_kinds_defaults(clean: Engine) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, SendEmail(to="a"), queue="urgent", priority=32767, max_attempts=1)
        JOBS.enqueue(session, Ping(n=1), priority=-32768, max_attempts=2**31 - 1)
        session.commit()
    rows = committed_rows(clean)
    assert [(r["queue"], r["priority"], r["max_attempts"], r["max_crashes"]) for r in rows] == [
        ("urgent", 32767, 1, 2),
        ("default", -32768, 2**31 - 1, 3),
    ]


def test_enqueue_by_kind_name_stores_the_validated_payload(clean: Engine) -> None:
    with Session(clean) as session:
        job = JOBS.enqueue(session, "send_email", {"to": "a@example.com", "ignored": 1})
        JOBS.enqueue(session, "ping", {"n": "42"})
        session.commit()
        assert job.kind == "send_email"
    rows = committed_rows(clean)
    assert [r["payload"] for r in rows] == [{"to": "a@example.com", "subject": ""}, {"n": 42}]


def test_enqueue_runs_on_the_sessions_connection_and_opens_none(
    migrated_url: str, clean: Engine, listener: Listener
) -> None:
    """A session joined to the caller's Connection: its commit only releases a savepoint, and the
    caller's rollback discards the jobs and their wakeup."""
    engine = create_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
    connects: list[object] = []
    event.listen(engine, "connect", lambda dbapi_conn, record: connects.append(dbapi_conn))

    def backends_started_in_this_transaction(conn: Connection) -> int:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        n = conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND backend_start >= now()"
                # Earlier tests' wakeups, sent late by this process's notifier: not ours.
                " AND application_name NOT LIKE 'sqla-jobs notifier %'"
            )
        )
        assert isinstance(n, int)
        return n

    try:
        with engine.connect() as conn:
            outer = conn.begin()
            with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
                job_id = JOBS.enqueue(session, Ping(n=1)).id
                ids = JOBS.enqueue_many(session, [Ping(n=2), SendEmail(to="x")])
                session.commit()
            assert backends_started_in_this_transaction(conn) == 0
            seen = list(conn.scalars(text("SELECT id FROM sqla_jobs_job ORDER BY id")))
            assert seen == [job_id, *ids]
            assert job_ids(clean) == []
            outer.rollback()
        assert len(connects) == 1
        assert job_ids(clean) == []
        assert listener.received() == []
    finally:
        engine.dispose()


def test_a_rolled_back_savepoint_discards_only_the_jobs_enqueued_inside_it(clean: Engine) -> None:
    with Session(clean) as session:
        kept_before = JOBS.enqueue(session, Ping(n=1)).id
        savepoint = session.begin_nested()
        JOBS.enqueue(session, Ping(n=2))
        JOBS.enqueue_many(session, [Ping(n=3), Ping(n=4)])
        savepoint.rollback()
        kept_after = JOBS.enqueue(session, Ping(n=5)).id
        session.commit()
    rows = committed_rows(clean)
    assert [r["id"] for r in rows] == [kept_before, kept_after]
    assert [r["payload"]["n"] for r in rows] == [1, 5]


def test_a_released_savepoint_keeps_its_jobs_when_the_outer_transaction_commits(
    clean: Engine,
) -> None:
    with Session(clean) as session:
        with session.begin_nested():
            inner = JOBS.enqueue(session, Ping(n=1)).id
        outer = JOBS.enqueue(session, Ping(n=2)).id
        session.commit()
    assert job_ids(clean) == [inner, outer]


def test_after_a_rollback_the_returned_job_is_transient_like_any_object_the_session_inserted(
    clean: Engine,
) -> None:
    """A rollback makes the Session's inserted objects transient (out of the session, attributes
    kept); the Job enqueue returns is one of them, with enqueue_many's rows in the same transaction,
    and is no longer a persistent object whose row is gone (ObjectDeletedError on access)."""
    with Session(clean) as session:
        job = JOBS.enqueue(session, Ping(n=1))
        JOBS.enqueue_many(session, [Ping(n=n) for n in range(COPY_THRESHOLD)])
        JOBS.enqueue_many(session, [Ping(n=2)])
        session.rollback()
        assert inspect(job).transient
        assert job not in session
        assert (job.kind, job.payload, job.state) == ("ping", {"n": 1}, "pending")
        assert JOBS.enqueue(session, Ping(n=3)).payload == {"n": 3}
        session.commit()
    assert [r["payload"] for r in committed_rows(clean)] == [{"n": 3}]


def test_a_rolled_back_savepoint_makes_only_its_own_jobs_transient(clean: Engine) -> None:
    with Session(clean) as session:
        before = JOBS.enqueue(session, Ping(n=1))
        with session.begin_nested():
            released = JOBS.enqueue(session, Ping(n=2))
        savepoint = session.begin_nested()
        inside = JOBS.enqueue(session, Ping(n=3))
        savepoint.rollback()
        assert inspect(inside).transient
        assert inspect(before).persistent
        assert inspect(released).persistent
        assert (before.payload, released.payload) == ({"n": 1}, {"n": 2})
        session.rollback()
        # The released savepoint's job belonged to the outer transaction, and goes with it.
        assert inspect(before).transient
        assert inspect(released).transient
        assert released.payload == {"n": 2}


def test_after_an_async_rollback_the_returned_job_is_transient(migrated_url: str) -> None:
    async def scenario() -> None:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                job = await JOBS.enqueue_async(session, Ping(n=1))
                await JOBS.enqueue_many_async(session, [Ping(n=n) for n in range(COPY_THRESHOLD)])
                await JOBS.enqueue_many_async(session, [Ping(n=2)])
                await session.rollback()
                assert inspect(job).transient
                assert (job.kind, job.payload) == ("ping", {"n": 1})
        finally:
            await engine.dispose()

    asyncio.run(scenario())


def test_separate_transactions_of_one_session_each_write_their_jobs(clean: Engine) -> None:
    with Session(clean) as session:
        first = JOBS.enqueue(session, Ping(n=1)).id
        session.commit()
        JOBS.enqueue(session, Ping(n=2))
        session.rollback()
        third = JOBS.enqueue(session, Ping(n=3)).id
        session.commit()
    assert job_ids(clean) == [first, third]


# -- scheduling -----------------------------------------------------------------------------------


def test_without_delay_or_run_at_the_job_is_due_at_the_database_now(clean: Engine) -> None:
    with Session(clean) as session:
        job = JOBS.enqueue(session, Ping(n=1))
        assert job.run_at == job.created_at == session.scalar(text("SELECT now()"))
        session.rollback()


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (timedelta(seconds=90), timedelta(seconds=90)),
        (timedelta(hours=23, microseconds=999999), timedelta(hours=23, microseconds=999999)),
        (timedelta(microseconds=1), timedelta(microseconds=1)),
        (timedelta(0), timedelta(0)),
        (7, timedelta(seconds=7)),
        (1.5, timedelta(seconds=1.5)),
        (0.000001, timedelta(microseconds=1)),
        (0, timedelta(0)),
    ],
    ids=repr,
)
def test_delay_is_added_to_the_database_clock(
    clean: Engine, delay: timedelta | float, expected: timedelta
) -> None:
    with Session(clean) as session:
        job = JOBS.enqueue(session, Ping(n=1), delay=delay)
        job_id = job.id
        [many] = JOBS.enqueue_many(session, [Ping(n=2)], delay=delay)
        # created_at and run_at both come from now(), the transaction's start: the difference is
        # the delay, exactly.
        assert utc_delta(job.run_at, job.created_at) == expected
        session.commit()
    with clean.connect() as conn:
        deltas = conn.execute(
            text("SELECT id, run_at - created_at FROM sqla_jobs_job ORDER BY id")
        ).all()
    assert [tuple(row) for row in deltas] == [(job_id, expected), (many, expected)]


def test_a_delay_in_days_is_added_as_elapsed_time(clean: Engine) -> None:
    delay = timedelta(days=3, microseconds=1)
    with Session(clean) as session:
        session.execute(text("SET LOCAL TIME ZONE 'UTC'"))
        job = JOBS.enqueue(session, Ping(n=1), delay=delay)
        assert utc_delta(job.run_at, job.created_at) == delay
        session.rollback()


def test_a_delay_in_days_is_exact_elapsed_time_across_a_dst_change(clean: Engine) -> None:
    try:
        paris = ZoneInfo("Europe/Paris")
    except ZoneInfoNotFoundError:
        pytest.skip("no time zone database")
    with Session(clean) as session:
        session.execute(text("SET LOCAL TIME ZONE 'Europe/Paris'"))
        now = session.scalar(text("SELECT now()"))
        assert isinstance(now, datetime)
        now = now.astimezone(UTC)
        offset = now.astimezone(paris).utcoffset()
        # Whole days from the database's now to just past Paris's next DST change.
        days = next(
            d
            for d in range(1, 367)
            if (now + timedelta(days=d)).astimezone(paris).utcoffset() != offset
        )
        job = JOBS.enqueue(session, Ping(n=1), delay=timedelta(days=days))
        got = utc_delta(job.run_at, job.created_at)
        session.rollback()
    assert got == timedelta(days=days)


@pytest.mark.parametrize(
    "run_at",
    [
        AWARE,
        AWARE.astimezone(timezone(timedelta(hours=5, minutes=30))),
        AWARE.astimezone(timezone(timedelta(hours=-9))),
        datetime(2000, 1, 1, tzinfo=UTC),
        # A day short of Python's limit, so a server in any time zone can hand it back.
        datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC),
    ],
    ids=str,
)
def test_an_aware_run_at_is_stored_as_the_same_instant(clean: Engine, run_at: datetime) -> None:
    with Session(clean) as session:
        job = JOBS.enqueue(session, Ping(n=1), run_at=run_at)
        JOBS.enqueue_many(session, [Ping(n=2), Ping(n=3)], run_at=run_at)
        assert job.run_at == run_at
        session.commit()
    with clean.connect() as conn:
        stored = list(conn.scalars(text("SELECT run_at FROM sqla_jobs_job ORDER BY id")))
    assert stored == [run_at] * 3
    assert all(s.astimezone(UTC) == run_at.astimezone(UTC) for s in stored)


def test_a_run_at_in_a_named_time_zone_is_stored_as_the_same_instant(clean: Engine) -> None:
    try:
        zone = ZoneInfo("America/New_York")
    except ZoneInfoNotFoundError:
        pytest.skip("no time zone database")
    run_at = datetime(2031, 7, 4, 12, 0, tzinfo=zone)
    with Session(clean) as session:
        JOBS.enqueue(session, Ping(n=1), run_at=run_at)
        session.commit()
    with clean.connect() as conn:
        stored = conn.scalar(text("SELECT run_at FROM sqla_jobs_job"))
    assert stored == datetime(2031, 7, 4, 16, 0, tzinfo=UTC)


# -- NOTIFY ---------------------------------------------------------------------------------------


def test_the_wakeup_is_delivered_at_commit_and_not_before(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, Ping(n=1))
        assert listener.received() == []
        session.commit()
    assert listener.received() == ["default"]


def test_the_wakeup_carries_only_the_queue_name(clean: Engine, listener: Listener) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, SendEmail(to="secret@example.com", subject="private"))
        session.commit()
    assert listener.received() == ["mail"]


def test_fifty_enqueues_to_one_queue_send_one_wakeup(clean: Engine, listener: Listener) -> None:
    with Session(clean) as session:
        for n in range(50):
            JOBS.enqueue(session, Ping(n=n))
        session.commit()
    assert listener.received() == ["default"]
    assert len(job_ids(clean)) == 50


def test_two_queues_in_one_transaction_send_one_wakeup_each(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        for n in range(25):
            JOBS.enqueue(session, Ping(n=n))
            JOBS.enqueue(session, SendEmail(to=str(n)))
            JOBS.enqueue_many(session, [Ping(n=n), SendEmail(to=str(n))])
        session.commit()
    assert Counter(listener.received()) == {"default": 1, "mail": 1}


def test_rollback_sends_no_wakeup(clean: Engine, listener: Listener) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, Ping(n=1))
        JOBS.enqueue_many(session, [SendEmail(to="x")])
        session.rollback()
    assert listener.received() == []


def test_each_committed_transaction_of_a_session_sends_its_own_wakeup(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, Ping(n=1))
        session.commit()
        assert listener.received() == ["default"]
        JOBS.enqueue(session, Ping(n=2))
        session.rollback()
        JOBS.enqueue(session, Ping(n=3))
        session.commit()
    assert listener.received() == ["default"]


def test_a_rolled_back_savepoint_does_not_suppress_the_outer_wakeup(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        savepoint = session.begin_nested()
        JOBS.enqueue(session, Ping(n=1))
        savepoint.rollback()
        JOBS.enqueue(session, Ping(n=2))
        session.commit()
    assert listener.received() == ["default"]


def test_a_rolled_back_savepoint_alone_sends_no_wakeup(clean: Engine, listener: Listener) -> None:
    with Session(clean) as session:
        savepoint = session.begin_nested()
        JOBS.enqueue(session, Ping(n=1))
        savepoint.rollback()
        session.commit()
    assert listener.received() == []
    assert job_ids(clean) == []


def test_enqueues_inside_and_outside_a_released_savepoint_send_one_wakeup(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        JOBS.enqueue(session, Ping(n=1))
        with session.begin_nested():
            JOBS.enqueue(session, Ping(n=2))
        JOBS.enqueue(session, Ping(n=3))
        session.commit()
    assert listener.received() == ["default"]


def test_enqueue_many_sends_one_wakeup_per_distinct_queue(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        JOBS.enqueue_many(session, [Ping(n=1), SendEmail(to="a"), Ping(n=2), SendEmail(to="b")])
        session.commit()
    assert Counter(listener.received()) == {"default": 1, "mail": 1}


def test_enqueue_many_with_a_queue_override_wakes_only_that_queue(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        JOBS.enqueue_many(session, [Ping(n=1), SendEmail(to="a")], queue="bulk")
        session.commit()
    assert listener.received() == ["bulk"]
    assert {r["queue"] for r in committed_rows(clean)} == {"bulk"}


def test_enqueue_many_of_nothing_writes_and_wakes_nothing(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        assert JOBS.enqueue_many(session, []) == []
        session.commit()
    assert listener.received() == []
    assert job_ids(clean) == []


# -- bad input ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """A call that must be refused with ``error`` before any SQL runs."""

    call: Callable[[Session], object]
    error: type[EnqueueError]


def _mutated_after_validation() -> Ping:
    ping = Ping(n=1)
    ping.n = "seven"  # type: ignore[assignment]
    return ping


def _ping_construct(**values: Any) -> Ping:
    """A ``Ping`` built without validation, as ``model_construct`` allows."""
    return Ping.model_construct(**values)


def _measure_construct(**values: Any) -> Measure:
    return Measure.model_construct(**values)


def _kind_name_without_mapping(session: Session) -> object:
    return JOBS.enqueue(session, "ping")  # type: ignore[call-overload]


def _model_and_mapping(session: Session) -> object:
    return JOBS.enqueue(session, Ping(n=1), {"n": 1})  # type: ignore[call-overload]


def _not_a_model(session: Session) -> object:
    return JOBS.enqueue(session, {"n": 1})  # type: ignore[call-overload]


def _mapping_not_a_dict(session: Session) -> object:
    return JOBS.enqueue(session, "ping", [("n", "x")])  # type: ignore[call-overload]


def _run_at_string(session: Session) -> object:
    return JOBS.enqueue(session, Ping(n=1), run_at="2031-01-01T00:00:00Z")  # type: ignore[call-overload]


def _delay_string(session: Session) -> object:
    return JOBS.enqueue(session, Ping(n=1), delay="5")  # type: ignore[call-overload]


def _priority_float(session: Session) -> object:
    return JOBS.enqueue(session, Ping(n=1), priority=1.5)  # type: ignore[call-overload]


def _enqueue_with(**options: Any) -> Callable[[Session], object]:
    def call(session: Session) -> object:
        return JOBS.enqueue(session, Ping(n=1), **options)

    return call


BAD_QUEUES = {
    "quote": "it's",
    "double-quote": 'a"b',
    "semicolon": "a;b",
    "nul": "a\x00b",
    "space": "a b",
    "trailing-newline": "a\n",
    "too-long": "q" * 129,
    "empty": "",
    "unicode": "fïle",
}

BAD_INPUT: dict[str, Bad] = {
    "mapping-invalid": Bad(lambda s: JOBS.enqueue(s, "ping", {"n": "seven"}), InvalidPayloadError),
    "mapping-missing-field": Bad(lambda s: JOBS.enqueue(s, "ping", {}), InvalidPayloadError),
    "mapping-not-a-dict": Bad(_mapping_not_a_dict, InvalidPayloadError),
    "model-construct-wrong-type": Bad(
        lambda s: JOBS.enqueue(s, _ping_construct(n="seven")), InvalidPayloadError
    ),
    "model-construct-missing-field": Bad(
        lambda s: JOBS.enqueue(s, _ping_construct()), InvalidPayloadError
    ),
    "model-construct-nan": Bad(
        lambda s: JOBS.enqueue(s, _measure_construct(value=math.nan)), InvalidPayloadError
    ),
    "model-mutated-after-validation": Bad(
        lambda s: JOBS.enqueue(s, _mutated_after_validation()), InvalidPayloadError
    ),
    "kind-name-without-mapping": Bad(_kind_name_without_mapping, InvalidPayloadError),
    "model-and-mapping": Bad(_model_and_mapping, InvalidPayloadError),
    "not-a-model": Bad(_not_a_model, InvalidPayloadError),
    "unregistered-model": Bad(lambda s: JOBS.enqueue(s, Unregistered(n=1)), UnknownKindError),
    "subclass-of-registered-model": Bad(
        lambda s: JOBS.enqueue(s, PingSubclass(n=1)), UnknownKindError
    ),
    "unregistered-kind": Bad(lambda s: JOBS.enqueue(s, "pong", {"n": 1}), UnknownKindError),
    "naive-run-at": Bad(_enqueue_with(run_at=datetime(2031, 1, 1)), InvalidScheduleError),
    "run-at-not-a-datetime": Bad(_run_at_string, InvalidScheduleError),
    "negative-delay": Bad(_enqueue_with(delay=-1), InvalidScheduleError),
    "negative-float-delay": Bad(_enqueue_with(delay=-0.5), InvalidScheduleError),
    "negative-timedelta": Bad(
        _enqueue_with(delay=timedelta(microseconds=-1)), InvalidScheduleError
    ),
    "delay-and-run-at": Bad(_enqueue_with(delay=1, run_at=AWARE), InvalidScheduleError),
    "delay-zero-and-run-at": Bad(_enqueue_with(delay=0, run_at=AWARE), InvalidScheduleError),
    "nan-delay": Bad(_enqueue_with(delay=math.nan), InvalidScheduleError),
    "inf-delay": Bad(_enqueue_with(delay=math.inf), InvalidScheduleError),
    "delay-not-a-number": Bad(_delay_string, InvalidScheduleError),
    "bool-delay": Bad(_enqueue_with(delay=True), InvalidScheduleError),
    **{
        f"queue-{label}": Bad(_enqueue_with(queue=name), InvalidQueueNameError)
        for label, name in BAD_QUEUES.items()
    },
    "payload-too-large": Bad(lambda s: SMALL.enqueue(s, Ping(n=12345678901)), PayloadTooLargeError),
    "priority-below-smallint": Bad(_enqueue_with(priority=-32769), InvalidOptionError),
    "priority-above-smallint": Bad(_enqueue_with(priority=32768), InvalidOptionError),
    "priority-bool": Bad(_enqueue_with(priority=True), InvalidOptionError),
    "priority-float": Bad(_priority_float, InvalidOptionError),
    "max-attempts-zero": Bad(_enqueue_with(max_attempts=0), InvalidOptionError),
    "max-attempts-negative": Bad(_enqueue_with(max_attempts=-1), InvalidOptionError),
    "max-attempts-over-integer": Bad(_enqueue_with(max_attempts=2**31), InvalidOptionError),
    "concurrency-key-without-limit": Bad(_enqueue_with(concurrency_key="k"), InvalidOptionError),
    "concurrency-key-empty": Bad(
        lambda s: JOBS.enqueue(s, Keyed(c="x"), concurrency_key=""), InvalidOptionError
    ),
    "concurrency-key-too-long": Bad(
        lambda s: JOBS.enqueue(s, Keyed(c="x"), concurrency_key="k" * 257), InvalidOptionError
    ),
    "concurrency-key-function-raises": Bad(
        lambda s: JOBS.enqueue(s, Account(account="explode")), InvalidPayloadError
    ),
    "concurrency-key-function-returns-empty": Bad(
        lambda s: JOBS.enqueue(s, Account(account="")), InvalidOptionError
    ),
    # Each of these was once refused too late (in the INSERT, aborting the caller's transaction)
    # or not at all.
    "nul-in-payload-string": Bad(
        lambda s: JOBS.enqueue(s, SendEmail(to="a\x00b")), InvalidPayloadError
    ),
    "nan-in-mapping": Bad(
        lambda s: JOBS.enqueue(s, "measure", {"value": math.nan}), InvalidPayloadError
    ),
    "delay-past-timestamptz": Bad(
        _enqueue_with(delay=timedelta(days=999_999_999)), InvalidScheduleError
    ),
    "float-delay-past-timestamptz": Bad(_enqueue_with(delay=1e13), InvalidScheduleError),
    "float-delay-past-timedelta": Bad(_enqueue_with(delay=1e20), InvalidScheduleError),
    "concurrency-key-nul": Bad(
        lambda s: JOBS.enqueue(s, Keyed(c="x"), concurrency_key="a\x00b"), InvalidOptionError
    ),
}


def _bad_params() -> list[Any]:
    return [pytest.param(bad, id=name) for name, bad in BAD_INPUT.items()]


@pytest.mark.parametrize("bad", _bad_params())
def test_bad_input_is_refused_writes_nothing_and_leaves_the_transaction_usable(
    clean: Engine, listener: Listener, bad: Bad
) -> None:
    assert issubclass(bad.error, EnqueueError)
    with Session(clean) as session:
        before = JOBS.enqueue(session, Ping(n=1)).id
        with pytest.raises(bad.error) as refused:
            bad.call(session)
        assert isinstance(refused.value, SqlaJobsError)
        assert str(refused.value)
        after = JOBS.enqueue(session, Ping(n=2)).id
        session.commit()
    assert job_ids(clean) == [before, after]
    assert listener.received() == ["default"]


@pytest.mark.parametrize(
    ("payloads", "error"),
    [
        ([Ping(n=1), _ping_construct(n="seven"), Ping(n=3)], InvalidPayloadError),
        ([Ping(n=1), Unregistered(n=2)], UnknownKindError),
        ([Ping(n=1), SendEmail(to="a"), PingSubclass(n=3)], UnknownKindError),
        ([Ping(n=1), _measure_construct(value="x")], InvalidPayloadError),
    ],
    ids=["invalid-last-but-one", "unregistered", "subclass", "model-construct"],
)
def test_one_bad_payload_in_enqueue_many_writes_none_of_them(
    clean: Engine, listener: Listener, payloads: list[BaseModel], error: type[EnqueueError]
) -> None:
    with Session(clean) as session:
        with pytest.raises(error):
            JOBS.enqueue_many(session, payloads)
        kept = JOBS.enqueue_many(session, [SendEmail(to="ok")])
        session.commit()
    assert job_ids(clean) == kept
    assert listener.received() == ["mail"]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"queue": "a;b"}, InvalidQueueNameError),
        ({"priority": 40000}, InvalidOptionError),
        ({"max_attempts": 0}, InvalidOptionError),
        ({"delay": -1}, InvalidScheduleError),
        ({"run_at": datetime(2031, 1, 1)}, InvalidScheduleError),
    ],
    ids=repr,
)
def test_bad_options_in_enqueue_many_write_nothing(
    clean: Engine, options: dict[str, Any], error: type[EnqueueError]
) -> None:
    with Session(clean) as session:
        with pytest.raises(error):
            JOBS.enqueue_many(session, [Ping(n=1), Ping(n=2)], **options)
        session.commit()
    assert job_ids(clean) == []


def test_a_payload_of_exactly_the_limit_is_accepted_and_one_byte_more_refused(
    clean: Engine,
) -> None:
    fits, over = Ping(n=1234567890), Ping(n=12345678901)
    assert len(fits.model_dump_json().encode()) == SMALL_LIMIT
    with Session(clean) as session:
        kept = SMALL.enqueue(session, fits).id
        with pytest.raises(PayloadTooLargeError, match=str(SMALL_LIMIT)):
            SMALL.enqueue(session, over)
        with pytest.raises(PayloadTooLargeError):
            SMALL.enqueue_many(session, [fits, over])
        session.commit()
    assert job_ids(clean) == [kept]


def test_the_payload_limit_counts_utf8_bytes_not_characters(clean: Engine) -> None:
    jobs = Jobs(max_payload_bytes=len('{"to":"ééé","subject":""}'.encode()))
    jobs.register("send_email", SendEmail)
    with Session(clean) as session:
        jobs.enqueue(session, SendEmail(to="ééé"))
        with pytest.raises(PayloadTooLargeError):
            jobs.enqueue(session, SendEmail(to="éééé"))
        session.rollback()


# -- enqueue_many ---------------------------------------------------------------------------------


def test_enqueue_many_returns_the_ids_in_payload_order(clean: Engine) -> None:
    payloads: list[BaseModel] = [Ping(n=n) if n % 3 else SendEmail(to=str(n)) for n in range(30)]
    with Session(clean) as session:
        ids = JOBS.enqueue_many(session, payloads)
        session.commit()
    rows = {r["id"]: r for r in committed_rows(clean)}
    assert sorted(rows) == sorted(ids)
    assert [rows[i]["payload"] for i in ids] == [p.model_dump() for p in payloads]
    assert [rows[i]["kind"] for i in ids] == [
        "ping" if isinstance(p, Ping) else "send_email" for p in payloads
    ]
    assert [rows[i]["queue"] for i in ids] == [
        "default" if isinstance(p, Ping) else "mail" for p in payloads
    ]
    assert [rows[i]["priority"] for i in ids] == [
        0 if isinstance(p, Ping) else -3 for p in payloads
    ]


def test_enqueue_many_accepts_any_iterable(clean: Engine) -> None:
    with Session(clean) as session:
        ids = JOBS.enqueue_many(session, (Ping(n=n) for n in range(3)))
        session.commit()
    assert job_ids(clean) == ids
    assert len(ids) == 3


def test_enqueue_many_of_100_000_jobs_reserves_their_ids_in_one_statement_then_copies_them(
    clean: Engine,
) -> None:
    count = 100_000
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()))

    payloads = [Ping(n=n) for n in range(count)]
    event.listen(clean, "before_cursor_execute", record)
    try:
        with Session(clean) as session:
            ids = JOBS.enqueue_many(session, payloads)
            session.commit()
    finally:
        event.remove(clean, "before_cursor_execute", record)
    # Through SQLAlchemy: the id reservation and the savepoint the COPY validates its later
    # chunks in; the rows went by COPY, and the wakeup after the commit, by the notifier.
    assert len(statements) == 3
    assert "nextval" in statements[0]
    assert statements[1:3] == ["SAVEPOINT sqla_jobs_copy", "RELEASE SAVEPOINT sqla_jobs_copy"]
    assert not any(s.upper().startswith("INSERT") for s in statements)
    assert len(ids) == len(set(ids)) == count
    assert ids == sorted(ids)
    with clean.connect() as conn:
        stats = conn.execute(
            text(
                "SELECT count(*), count(DISTINCT payload->>'n'), min((payload->>'n')::int), "
                "max((payload->>'n')::int), min(j.id), max(j.id), "
                "count(*) FILTER (WHERE x.i = (payload->>'n')::int + 1) FROM sqla_jobs_job j "
                "JOIN unnest(CAST(:ids AS bigint[])) WITH ORDINALITY AS x(id, i) ON x.id = j.id"
            ),
            {"ids": ids},
        ).one()
    # Every payload sits under the id returned at its position.
    assert tuple(stats) == (count, count, 0, count - 1, min(ids), max(ids), count)


#: What a stored job is made of, beyond its id and timestamps.
STORED = (
    "queue",
    "kind",
    "payload",
    "state",
    "priority",
    "attempts",
    "max_attempts",
    "crashes",
    "max_crashes",
    "lease_token",
    "lease_expires_at",
    "locked_by",
    "last_error",
    "concurrency_key",
    "concurrency_limit",
    "steps",
)


def mixed_payloads(count: int) -> list[BaseModel]:
    """Every kind of JOBS in turn: other queues and priorities, keyed by function and by limit."""
    makers: list[Callable[[int], BaseModel]] = [
        lambda n: Ping(n=n),
        lambda n: SendEmail(to=f"{n}@example.com", subject="tab\there\nnew \\ line"),
        lambda n: Account(account=f"acct\t{n % 3}"),
        lambda n: Keyed(c=f"ké\\y{n}"),
        lambda n: Measure(value=n / 7),
    ]
    return [makers[n % len(makers)](n) for n in range(count)]


def stored(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[c] for c in STORED)


def test_a_batch_sent_by_copy_is_stored_exactly_like_one_sent_by_insert(clean: Engine) -> None:
    """Just below the COPY threshold enqueue_many sends one INSERT; at it, a COPY. Same payloads,
    same rows: values with tabs, newlines and backslashes included."""
    below, at = COPY_THRESHOLD - 1, COPY_THRESHOLD
    with Session(clean) as session:
        inserted = JOBS.enqueue_many(session, mixed_payloads(below), delay=30)
        copied = JOBS.enqueue_many(session, mixed_payloads(at), delay=30)
        now = session.scalar(text("SELECT now()"))
        session.commit()
    rows = committed_rows(clean)
    assert [r["id"] for r in rows] == inserted + copied
    assert {(r["run_at"], r["created_at"]) for r in rows} == {(now + timedelta(seconds=30), now)}
    assert [stored(r) for r in rows[:below]] == [stored(r) for r in rows[below : below + below]]
    assert (rows[-1]["kind"], rows[-1]["payload"]) == ("keyed", {"c": f"ké\\y{at - 1}"})
    assert {r["concurrency_key"] for r in rows if r["kind"] == "account_sync"} == {
        f"acct\t{i}" for i in range(3)
    }


def test_copy_escapes_raw_control_characters_and_backslashes_in_every_text_column(
    clean: Engine,
) -> None:
    """enqueue_many formats COPY's text itself. pydantic never writes a raw tab or newline, but
    JSON may hold them as whitespace, and a concurrency key may hold anything: a hand-built batch
    with both, through the COPY path, is stored as written."""
    payload = '{\n\t"a": "x\\\\y\\n",\r\n "b": [1,\t2]}'
    key = "k\\N\t\r\n\\\\"
    batch = Batch()
    for n in range(COPY_THRESHOLD):
        batch.add(Prepared(JOBS.by_model(Keyed), payload, "other.q", -3, 7, 2, f"{key}{n}", n + 1))
    with Session(clean) as session:
        ids = enqueue_many(
            session,
            len(batch),
            iter([batch]),
            None,
            timedelta(0),
            schema=None,
            wakeup=JOBS._wakeup,
        )
        session.commit()
    rows = committed_rows(clean)
    assert [r["id"] for r in rows] == ids
    expected = {"a": "x\\y\n", "b": [1, 2]}
    assert [
        (r["queue"], r["kind"], r["payload"], r["priority"], r["max_attempts"]) for r in rows
    ] == [("other.q", "keyed", expected, -3, 7)] * COPY_THRESHOLD
    assert [(r["concurrency_key"], r["concurrency_limit"]) for r in rows] == [
        (f"{key}{n}", n + 1) for n in range(COPY_THRESHOLD)
    ]


def test_a_streamed_copy_wakes_the_queues_of_its_later_chunks(
    clean: Engine, listener: Listener
) -> None:
    with Session(clean) as session:
        JOBS.enqueue_many(session, [*(Ping(n=n) for n in range(CHUNK)), SendEmail(to="a")])
        session.commit()
    assert Counter(listener.received()) == {"default": 1, "mail": 1}


def test_a_copied_batch_takes_an_aware_run_at_as_the_same_instant(clean: Engine) -> None:
    with Session(clean) as session:
        JOBS.enqueue_many(session, [Ping(n=n) for n in range(COPY_THRESHOLD)], run_at=AWARE)
        session.commit()
    assert {r["run_at"] for r in committed_rows(clean)} == {AWARE}


def test_a_rolled_back_savepoint_discards_a_copied_batch(clean: Engine, listener: Listener) -> None:
    with Session(clean) as session:
        kept = JOBS.enqueue_many(session, [Ping(n=n) for n in range(COPY_THRESHOLD)])
        savepoint = session.begin_nested()
        JOBS.enqueue_many(session, [SendEmail(to=str(n)) for n in range(COPY_THRESHOLD)])
        savepoint.rollback()
        session.commit()
    assert job_ids(clean) == kept
    assert listener.received() == ["default"]


@pytest.fixture
def refuses_thirteen(clean: Engine) -> Iterator[Engine]:
    """A CHECK the table does not have: the database refuses a payload of n = 13."""
    with clean.begin() as conn:
        conn.execute(
            text(
                "ALTER TABLE sqla_jobs_job ADD CONSTRAINT no_thirteen "
                "CHECK (payload->>'n' IS DISTINCT FROM '13')"
            )
        )
    yield clean
    with clean.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_jobs_job DROP CONSTRAINT no_thirteen"))


@pytest.mark.parametrize("count", [COPY_THRESHOLD - 1, COPY_THRESHOLD], ids=["insert", "copy"])
def test_a_batch_the_database_refuses_raises_sqlalchemys_error_and_writes_nothing(
    refuses_thirteen: Engine, listener: Listener, count: int
) -> None:
    with Session(refuses_thirteen) as session:
        with pytest.raises(sa_exc.IntegrityError, match="no_thirteen"):
            JOBS.enqueue_many(session, [Ping(n=n) for n in range(count)])
        session.rollback()
        kept = JOBS.enqueue_many(session, [Ping(n=n) for n in range(14, 14 + count)])
        session.commit()
    assert job_ids(refuses_thirteen) == kept
    assert listener.received() == ["default"]


def test_a_connection_lost_during_the_copy_raises_and_is_not_reused(
    clean: Engine, migrated_url: str
) -> None:
    """The server ends the backend between the id reservation and the COPY: SQLAlchemy's
    disconnect error, the pooled connection invalidated, and the next session works."""
    engine = create_engine(sqlalchemy_url(migrated_url))

    def kill_own_backend(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if "nextval" not in statement:
            return
        pid = conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
        with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))

    event.listen(engine, "after_cursor_execute", kill_own_backend)
    try:
        with Session(engine) as session:
            with pytest.raises(sa_exc.DBAPIError) as lost:
                JOBS.enqueue_many(session, [Ping(n=n) for n in range(COPY_THRESHOLD)])
            assert lost.value.connection_invalidated
            session.rollback()
        event.remove(engine, "after_cursor_execute", kill_own_backend)
        with Session(engine) as session:
            kept = JOBS.enqueue_many(session, [Ping(n=n) for n in range(COPY_THRESHOLD)])
            session.commit()
        assert job_ids(clean) == kept
    finally:
        engine.dispose()


def test_a_connection_lost_during_an_async_copy_raises_and_is_not_reused(
    clean: Engine, migrated_url: str
) -> None:
    engine = create_async_engine(sqlalchemy_url(migrated_url))

    def kill_own_backend(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if "nextval" in statement:
            pid = conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
            with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as killer:
                killer.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))

    async def scenario() -> list[int]:
        event.listen(engine.sync_engine, "after_cursor_execute", kill_own_backend)
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(sa_exc.DBAPIError) as lost:
                    await JOBS.enqueue_many_async(
                        session, [Ping(n=n) for n in range(COPY_THRESHOLD)]
                    )
                assert lost.value.connection_invalidated
                await session.rollback()
            event.remove(engine.sync_engine, "after_cursor_execute", kill_own_backend)
            async with AsyncSession(engine) as session:
                kept = await JOBS.enqueue_many_async(
                    session, [Ping(n=n) for n in range(COPY_THRESHOLD)]
                )
                await session.commit()
            return kept
        finally:
            await engine.dispose()

    kept = asyncio.run(scenario())
    assert job_ids(clean) == kept


def test_a_driver_without_copy_falls_back_to_one_insert(
    clean: Engine, migrated_url: str, listener: Listener
) -> None:
    """psycopg2 (not psycopg 3): the batch goes as one INSERT ... unnest, with the same result."""
    pytest.importorskip("psycopg2")
    url = make_url(sqlalchemy_url(migrated_url)).set(drivername="postgresql+psycopg2")
    engine = create_engine(url, poolclass=NullPool)
    inserts: list[str] = []
    event.listen(
        engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *args: (
            inserts.append(statement) if "INSERT INTO" in statement else None
        ),
    )
    try:
        with Session(engine) as session:
            job = JOBS.enqueue(session, Ping(n=-1), delay=5)
            ids = JOBS.enqueue_many(session, mixed_payloads(COPY_THRESHOLD))
            session.commit()
            assert utc_delta(job.run_at, job.created_at) == timedelta(seconds=5)
    finally:
        engine.dispose()
    assert len(inserts) == 2
    rows = committed_rows(clean)
    assert [r["id"] for r in rows] == [job.id, *ids]
    with Session(clean) as session:
        reference = JOBS.enqueue_many(session, mixed_payloads(COPY_THRESHOLD))
        session.commit()
    copied = committed_rows(clean)[-len(reference) :]
    assert [stored(r) for r in rows[1:]] == [stored(r) for r in copied]
    plain, due = by_form(listener.received())
    assert plain == ["default", "mail", "default", "mail"]
    assert due == ["due default"]  # the delayed job: its time, after the commit


def test_enqueue_many_names_the_position_of_the_bad_payload(clean: Engine) -> None:
    with Session(clean) as session:
        with pytest.raises(InvalidPayloadError, match=r"^payload 2: payload for kind 'ping'"):
            JOBS.enqueue_many(session, [Ping(n=1), SendEmail(to="a"), _ping_construct(n="x")])
        with pytest.raises(UnknownKindError, match=r"^payload 1: "):
            JOBS.enqueue_many(session, [Ping(n=1), Unregistered(n=1)])
        with pytest.raises(InvalidPayloadError, match=r"^payload 0: enqueue_many takes"):
            JOBS.enqueue_many(session, [{"n": 1}])  # type: ignore[list-item]
        session.rollback()


def _streamed(bad: BaseModel, at: int, count: int) -> list[BaseModel]:
    """``count`` payloads, of two queues, with ``bad`` at position ``at``: past the first chunk,
    so the COPY has already sent the rows before it when ``bad`` is validated."""
    assert CHUNK < at < count
    payloads: list[BaseModel] = [Ping(n=n) if n % 2 else SendEmail(to=str(n)) for n in range(count)]
    payloads[at] = bad
    return payloads


@pytest.mark.parametrize(
    ("bad", "error"),
    [(_ping_construct(n="x"), InvalidPayloadError), (Unregistered(n=1), UnknownKindError)],
    ids=["invalid", "unknown kind"],
)
def test_a_bad_payload_met_during_the_copy_rolls_it_back_and_keeps_the_transaction(
    clean: Engine, listener: Listener, bad: BaseModel, error: type[EnqueueError]
) -> None:
    """Past the first chunk, enqueue_many validates while its COPY runs: a bad payload there
    aborts the COPY inside a savepoint, so what the transaction held before is kept, and it goes
    on."""
    at = CHUNK * 2 + 5
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(clean, "before_cursor_execute", record)
    try:
        with Session(clean) as session:
            before = JOBS.enqueue(session, Account(account="acme")).id
            with pytest.raises(error, match=rf"^payload {at}: "):
                JOBS.enqueue_many(session, _streamed(bad, at, CHUNK * 3))
            after = JOBS.enqueue_many(session, [Ping(n=n) for n in range(COPY_THRESHOLD)])
            session.commit()
    finally:
        event.remove(clean, "before_cursor_execute", record)
    assert "ROLLBACK TO SAVEPOINT sqla_jobs_copy" in statements
    assert job_ids(clean) == [before, *after]
    assert listener.received() == ["default"]


def test_a_bad_payload_met_during_an_async_copy_rolls_it_back_and_keeps_the_transaction(
    migrated_url: str, clean: Engine, listener: Listener
) -> None:
    at = CHUNK + 1

    async def scenario() -> list[int]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                before = (await JOBS.enqueue_async(session, Account(account="acme"))).id
                with pytest.raises(InvalidPayloadError, match=rf"^payload {at}: "):
                    await JOBS.enqueue_many_async(
                        session, _streamed(_ping_construct(n="x"), at, CHUNK * 2)
                    )
                after = await JOBS.enqueue_many_async(session, [Ping(n=1), Ping(n=2)])
                await session.commit()
                return [before, *after]
        finally:
            await engine.dispose()

    kept = asyncio.run(scenario())
    assert job_ids(clean) == kept
    assert listener.received() == ["default"]


def test_the_returned_job_is_the_row_as_the_database_stored_it(clean: Engine) -> None:
    """enqueue builds its Job from what it bound and what the insert returned, without loading
    the row: every mapped attribute must equal the row read back."""
    with Session(clean, expire_on_commit=False) as session:
        made = [
            JOBS.enqueue(session, Ping(n=1)),
            JOBS.enqueue(session, SendEmail(to="a"), delay=timedelta(minutes=5), priority=7),
            JOBS.enqueue(session, Account(account="acme"), run_at=AWARE),
            JOBS.enqueue(session, "keyed", {"c": "x"}, concurrency_key="k", queue="other"),
        ]
        session.commit()
    columns = [attr.key for attr in inspect(Job).column_attrs]
    with Session(clean) as session:
        for job in made:
            loaded = session.get(Job, job.id)
            assert loaded is not None
            assert {c: getattr(job, c) for c in columns} == {c: getattr(loaded, c) for c in columns}


# -- AsyncSession ---------------------------------------------------------------------------------


def test_enqueue_async_and_enqueue_many_async_commit_makes_jobs_visible(
    migrated_url: str, clean: Engine, listener: Listener
) -> None:
    async def scenario() -> list[int]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                job = await JOBS.enqueue_async(session, Ping(n=1))
                assert job.id is not None
                job_id = job.id
                ids = await JOBS.enqueue_many_async(session, [Ping(n=2), SendEmail(to="a")])
                assert job_ids(clean) == []
                await session.commit()
                return [job_id, *ids]
        finally:
            await engine.dispose()

    ids = asyncio.run(scenario())
    assert job_ids(clean) == ids
    assert Counter(listener.received()) == {"default": 1, "mail": 1}


def test_enqueue_many_async_copies_a_large_batch_on_the_async_connection(
    migrated_url: str, clean: Engine, listener: Listener
) -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                copied = await JOBS.enqueue_many_async(
                    session, mixed_payloads(COPY_THRESHOLD * 3), delay=timedelta(seconds=5)
                )
                inserted = await JOBS.enqueue_many_async(session, mixed_payloads(3))
                await session.commit()
                return copied, inserted
        finally:
            await engine.dispose()

    copied, inserted = asyncio.run(scenario())
    rows = committed_rows(clean)
    assert [r["id"] for r in rows] == copied + inserted
    assert {utc_delta(r["run_at"], r["created_at"]) for r in rows[: len(copied)]} == {
        timedelta(seconds=5)
    }
    assert [stored(r) for r in rows[:3]] == [stored(r) for r in rows[len(copied) :]]
    plain, due = by_form(listener.received())
    assert Counter(plain) == {"default": 1, "mail": 1}
    assert sorted(due) == ["due default", "due mail"]


def test_enqueue_async_rollback_writes_and_wakes_nothing(
    migrated_url: str, clean: Engine, listener: Listener
) -> None:
    async def scenario() -> None:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                await JOBS.enqueue_async(session, Ping(n=1))
                await JOBS.enqueue_many_async(session, [Ping(n=2), SendEmail(to="a")])
                await session.rollback()
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert job_ids(clean) == []
    assert listener.received() == []


def test_enqueue_async_refuses_bad_input_and_keeps_the_transaction_usable(
    migrated_url: str, clean: Engine
) -> None:
    async def scenario() -> int:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(InvalidPayloadError):
                    await JOBS.enqueue_async(session, _ping_construct(n="x"))
                with pytest.raises(UnknownKindError):
                    await JOBS.enqueue_many_async(session, [Ping(n=1), Unregistered(n=1)])
                job = await JOBS.enqueue_async(session, Ping(n=1))
                job_id = job.id
                await session.commit()
                return job_id
        finally:
            await engine.dispose()

    job_id = asyncio.run(scenario())
    assert job_ids(clean) == [job_id]


# -- another schema -------------------------------------------------------------------------------


@pytest.fixture
def alt_schema(clean: Engine, migrated_url: str) -> Iterator[str]:
    """The migrations run into schema ``sqla_jobs_alt``; dropped afterwards."""
    with migrated_schema(clean, migrated_url, ALT_SCHEMA) as schema:
        yield schema


def test_a_schema_jobs_enqueues_into_that_schema_and_notifies_its_channel(
    clean: Engine, alt_schema: str, listen: Callable[[str], Listener]
) -> None:
    assert ALT.channel == "sqla_jobs.sqla_jobs_alt"
    alt, default = listen(ALT.channel), listen(JOBS.channel)
    with Session(clean) as session:
        job = ALT.enqueue(session, Ping(n=1), delay=timedelta(seconds=3))
        job_id, delta = job.id, utc_delta(job.run_at, job.created_at)
        ids = ALT.enqueue_many(session, [Ping(n=2), Ping(n=3)])
        session.commit()
    assert delta == timedelta(seconds=3)
    assert job_ids(clean, alt_schema) == [job_id, *ids]
    assert job_ids(clean) == []
    assert by_form(alt.received()) == (["default"], ["due default"])
    assert default.received() == []


def test_a_schema_jobs_copies_a_large_batch_into_that_schema(
    clean: Engine, alt_schema: str
) -> None:
    with Session(clean) as session:
        ids = ALT.enqueue_many(session, [Ping(n=n) for n in range(COPY_THRESHOLD)])
        session.commit()
    assert job_ids(clean, alt_schema) == ids
    assert job_ids(clean) == []


def test_a_schema_jobs_rollback_writes_nothing_in_that_schema(
    clean: Engine, alt_schema: str
) -> None:
    with Session(clean) as session:
        ALT.enqueue(session, Ping(n=1))
        session.rollback()
    assert job_ids(clean, alt_schema) == []


# -- ids past 32 bits -----------------------------------------------------------------------------


@pytest.fixture
def ids_past_int4(clean: Engine) -> Iterator[Engine]:
    """The identity restarted at 3,000,000,000; back to 1 afterwards."""
    with clean.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_jobs_job ALTER COLUMN id RESTART WITH 3000000000"))
    yield clean
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_job RESTART IDENTITY"))


def test_ids_past_two_to_the_31_are_returned_intact(ids_past_int4: Engine) -> None:
    with Session(ids_past_int4) as session:
        job = JOBS.enqueue(session, Ping(n=1))
        job_id = job.id
        ids = JOBS.enqueue_many(session, [Ping(n=2), Ping(n=3)])
        session.commit()
    assert job_id == 3_000_000_000
    assert ids == [3_000_000_001, 3_000_000_002]
    assert job_ids(ids_past_int4) == [job_id, *ids]
