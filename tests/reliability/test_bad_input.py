"""Bad input, from the application and from the table: what is refused, what is dead-lettered, and
that neither ever costs a transaction, a worker, or a table.

Enqueue refuses bad input with a :class:`sqla_jobs.EnqueueError` before any SQL runs, so the
caller's transaction stays usable. Rows that reach the table anyway (hand-inserted, written by an
older release, by another producer) are the worker's problem: a payload that no longer validates is
dead at once, an unknown kind is a failure with backoff, and the worker keeps running either way.
Hostile names (quotes, semicolons, NUL, kilobytes of unicode) are fuzzed with hypothesis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import (
    ConfigurationError,
    EnqueueError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidQueueNameError,
    Job,
    JobContext,
    Jobs,
    PayloadTooLargeError,
    RegistryError,
    UnknownKindError,
    Worker,
    testing,
)
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
from sqla_jobs.enqueue.insert import CHUNK, COPY_THRESHOLD
from tests.reliability import edge_app
from tests.reliability.conftest import Figures, injects
from tests.reliability.edge_app import wait_running

QUEUE = "bad"
SENTINEL = "reliability_sentinel"
#: A URL nothing listens on: configuration errors must come before any connection is tried.
NOWHERE = "postgresql://nobody@127.0.0.1:1/nothing"
#: The documented rule for queue and kind names (docs/jobs.md, kinds.check_name).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
FUZZ = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

jobs = Jobs()
ran: Counter[int] = Counter()
ran_lock = threading.Lock()


class Order(BaseModel):
    order_id: int
    email: str


class Blob(BaseModel):
    data: str


class Note(BaseModel):
    text: str


class Anything(BaseModel):
    value: Any = None


class Stamp(BaseModel):
    """Strict: in Python mode a datetime field accepts only datetime objects, in JSON mode the
    ISO string the JSON holds."""

    model_config = ConfigDict(strict=True)
    at: datetime
    ref: uuid.UUID


class EnqueueOnly(BaseModel):
    n: int


class Tenant(BaseModel):
    """Keyed by a function of the payload: its tenant, unescaped (a key that, like one from
    ``json.loads``, may hold text the payload holds only escaped)."""

    tenant: str
    tags: dict[str, str] = {}


def tenant_key(payload: Tenant) -> str:
    return payload.tenant.encode("ascii", "backslashreplace").decode("unicode_escape")


class Unregistered(BaseModel):
    n: int


def record(ctx: JobContext) -> None:
    with ran_lock:
        ran[ctx.job_id] += 1


stamps: dict[int, Stamp] = {}


@jobs.kind("bad_order", Order, queue=QUEUE)
def order(args: Order, ctx: JobContext) -> None:
    record(ctx)


@jobs.kind("bad_blob", Blob, queue=QUEUE)
def blob(args: Blob, ctx: JobContext) -> None:
    record(ctx)


@jobs.kind("bad_note", Note, queue=QUEUE, concurrency_limit=2)
def note(args: Note, ctx: JobContext) -> None:
    record(ctx)


@jobs.kind("bad_anything", Anything, queue=QUEUE)
def anything(args: Anything, ctx: JobContext) -> None:
    record(ctx)


@jobs.kind("bad_stamp", Stamp, queue=QUEUE)
def stamp(args: Stamp, ctx: JobContext) -> None:
    stamps[ctx.job_id] = args
    record(ctx)


# Known to this process (it may enqueue it), but no handler here: as during a deploy.
jobs.register("bad_enqueue_only", EnqueueOnly, queue=QUEUE)
jobs.register("bad_tenant", Tenant, queue=QUEUE, concurrency_key=tenant_key, concurrency_limit=1)


@pytest.fixture(scope="module")
def sentinel(engine: Engine) -> Iterator[Engine]:
    """A table that must survive every hostile name, with one row in it."""
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {SENTINEL} (id int)"))
        conn.execute(text(f"TRUNCATE {SENTINEL}"))
        conn.execute(text(f"INSERT INTO {SENTINEL} VALUES (1)"))
    yield engine
    assert_sentinel(engine)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {SENTINEL}"))


def assert_sentinel(engine: Engine) -> None:
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {SENTINEL}")).scalar_one() == 1


@pytest.fixture
def fresh(clean: Engine, sentinel: Engine) -> Engine:
    """An empty queue, the sentinel in place, and no handler runs recorded."""
    ran.clear()
    stamps.clear()
    return clean


def stored(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar_one())


def worker(url: str, **options: Any) -> Worker:
    defaults: dict[str, Any] = {"queues": [QUEUE], "poll_interval": 0.1, "lease": 10.0}
    return Worker(jobs, url, **{**defaults, **options})


def hand_insert(engine: Engine, kind: str, payload_json: str) -> int:
    """Insert a job row as another producer (or an older release) might have: no validation."""
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO sqla_jobs_job (queue, kind, payload) "
                    "VALUES (:queue, :kind, CAST(:payload AS jsonb)) RETURNING id"
                ),
                {"queue": QUEUE, "kind": kind, "payload": payload_json},
            ).scalar_one()
        )


def job_row(engine: Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT state, attempts, last_error, EXTRACT(EPOCH FROM run_at - now()) AS wait "
                "FROM sqla_jobs_job WHERE id = :id"
            ),
            {"id": job_id},
        ).first()


def deep(depth: int) -> str:
    return '{"value": ' + "[" * depth + "]" * depth + "}"


def json_size(model: BaseModel) -> int:
    return len(model.model_dump_json().encode())


# -- enqueue --------------------------------------------------------------------------------------


@injects("payloads that do not validate against their kind's model")
def test_invalid_payloads_are_refused_and_the_transaction_stays_usable(
    fresh: Engine, figures: Figures
) -> None:
    """Payloads that fail validation raise InvalidPayloadError (or UnknownKindError) before any
    SQL: the job enqueued earlier in the same transaction commits, nothing else is written."""
    bad: list[tuple[Any, Any, type[EnqueueError]]] = [
        ("bad_order", {"order_id": "not a number", "email": "a@example.com"}, InvalidPayloadError),
        ("bad_order", {"email": "a@example.com"}, InvalidPayloadError),
        ("bad_order", {"order_id": 1, "email": ["not", "a", "string"]}, InvalidPayloadError),
        ("bad_order", None, InvalidPayloadError),
        (Order.model_construct(order_id="x", email=1), None, InvalidPayloadError),  # type: ignore[arg-type]
        (Note(text="a\x00b"), None, InvalidPayloadError),
        (Unregistered(n=1), None, UnknownKindError),
        ("no_such_kind", {"n": 1}, UnknownKindError),
        (42, None, InvalidPayloadError),
    ]
    messages = []
    with Session(fresh) as session:
        good = jobs.enqueue(session, Order(order_id=1, email="a@example.com")).id
        for payload, data, error in bad:
            args = (payload,) if data is None else (payload, data)
            with pytest.raises(error) as caught:
                jobs.enqueue(session, *args)
            messages.append(str(caught.value))
        with pytest.raises(InvalidPayloadError):
            jobs.enqueue_many(
                session,
                [Order(order_id=2, email="b"), Order.model_construct(order_id="y", email=2)],  # type: ignore[arg-type]
            )
        session.commit()
    with fresh.connect() as conn:
        assert conn.execute(text("SELECT id FROM sqla_jobs_job")).scalars().all() == [good]
    assert "order_id" in messages[0]
    figures.record(refused=len(messages) + 1, written=1)


@injects("payloads over Jobs(max_payload_bytes)")
def test_payloads_over_max_payload_bytes_are_refused_before_any_sql(
    fresh: Engine, figures: Figures
) -> None:
    """A payload one byte over max_payload_bytes (counted in UTF-8 bytes, not characters) raises
    PayloadTooLargeError and writes nothing; one exactly at the limit is enqueued."""
    small = Jobs(max_payload_bytes=1024)
    small.register("bad_blob", Blob, queue=QUEUE)
    at_limit = Blob(data="x" * (1024 - json_size(Blob(data=""))))
    over = Blob(data=at_limit.data + "x")
    # Two-byte characters: fewer than 1024 characters, more than 1024 bytes.
    wide = Blob(data="é" * 510)
    assert json_size(at_limit) == 1024
    assert len(wide.model_dump_json()) < 1024 < json_size(wide)
    with Session(fresh) as session:
        kept = small.enqueue(session, at_limit).id
        for payload in (over, wide):
            with pytest.raises(PayloadTooLargeError):
                small.enqueue(session, payload)
        session.commit()
    with fresh.connect() as conn:
        assert conn.execute(text("SELECT id FROM sqla_jobs_job")).scalars().all() == [kept]
    figures.record(limit_bytes=1024, refused_bytes=[json_size(over), json_size(wide)])


@injects("payloads around PostgreSQL's 8000-byte NOTIFY limit")
def test_payloads_around_the_notify_limit_are_enqueued_and_still_wake_the_worker(
    fresh: Engine, migrated_url: str, figures: Figures
) -> None:
    """Payloads of 7,999, 8,000, 8,001, 9,000 and 65,536 bytes (the default limit) are enqueued,
    each commit sends one NOTIFY carrying only the queue name, and a worker that would otherwise
    poll once a minute runs each of them within seconds."""
    sizes = [7_999, 8_000, 8_001, 9_000, jobs.max_payload_bytes]
    empty = json_size(Blob(data=""))
    payloads = [Blob(data="p" * (size - empty)) for size in sizes]
    assert [json_size(p) for p in payloads] == sizes
    with Session(fresh) as session, pytest.raises(PayloadTooLargeError):
        jobs.enqueue(session, Blob(data="p" * (jobs.max_payload_bytes + 1 - empty)))

    listen = psycopg.connect(libpq_conninfo(migrated_url), autocommit=True)
    listen.execute(f'LISTEN "{jobs.channel}"')
    slow_poll = worker(migrated_url, poll_interval=60.0)
    latencies = []
    try:
        with edge_app.running(slow_poll) as crashes:
            assert slow_poll.listener is not None
            wait_running(crashes, lambda: slow_poll.listener.connects >= 1, "LISTEN is up")  # type: ignore[union-attr]
            for payload in payloads:
                with Session(fresh) as session:
                    job_id = jobs.enqueue(session, payload).id
                    session.commit()
                committed = time.monotonic()
                notes = list(listen.notifies(timeout=5, stop_after=1))
                assert [(n.channel, n.payload) for n in notes] == [(jobs.channel, QUEUE)]
                wait_running(crashes, lambda job_id=job_id: ran[job_id] == 1, "the job runs")
                latencies.append(round(time.monotonic() - committed, 3))
    finally:
        listen.close()
    assert stored(fresh) == 0
    figures.record(payload_bytes=sizes, commit_to_run_s=latencies, poll_interval_s=60)


# -- rows the worker finds ------------------------------------------------------------------------


@injects("hand-inserted rows whose payload does not validate")
def test_rows_whose_payload_no_longer_validates_are_dead_and_the_worker_keeps_running(
    fresh: Engine, migrated_url: str, figures: Figures
) -> None:
    """Rows whose payload does not validate (wrong types, missing fields, not an object at all)
    are dead after one attempt, with the reason; the jobs around them run."""
    payloads = [
        '{"order_id": "seven", "email": "a@example.com"}',
        '{"email": "a@example.com"}',
        "[]",
        '"just a string"',
        "42",
        "null",
    ]
    bad = [hand_insert(fresh, "bad_order", p) for p in payloads]
    good = hand_insert(fresh, "bad_order", '{"order_id": 1, "email": "a@example.com"}')
    # An unknown extra field is ignored by the model (pydantic's default): valid, and runs.
    extra = hand_insert(fresh, "bad_order", '{"order_id": 2, "email": "b", "new_field": [1]}')
    with edge_app.running(worker(migrated_url)) as crashes:
        wait_running(crashes, lambda: ran[good] == ran[extra] == 1, "the valid jobs run")

        def all_dead() -> bool:
            rows = [job_row(fresh, i) for i in bad]
            return all(r is not None and r.state == "dead" for r in rows)

        wait_running(crashes, all_dead, "the invalid rows are dead")
    rows = {i: job_row(fresh, i) for i in bad}
    for row in rows.values():
        assert row.attempts == 1
        assert row.last_error.startswith("payload no longer validates against Order")
    assert not any(ran[i] for i in rows)
    figures.record(dead=len(rows), ran=2)


@injects("a hand-inserted row whose invalid payload carries a secret")
def test_dead_letter_reason_does_not_copy_payload_values_into_last_error_or_logs(
    fresh: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture, figures: Figures
) -> None:
    """A payload that no longer validates is dead with a reason that names the field and the
    problem, but never the payload's values: not in last_error, not in the logs."""
    secret = "SECRET-TOKEN-4242"
    job_id = hand_insert(fresh, "bad_order", json.dumps({"order_id": secret, "email": secret}))
    with (
        caplog.at_level(logging.INFO, logger="sqla_jobs"),
        edge_app.running(worker(migrated_url)) as crashes,
    ):
        row = wait_running(
            crashes,
            lambda: (r := job_row(fresh, job_id)) is not None and r.state == "dead" and r,
            "the row is dead",
        )
    assert "order_id" in row.last_error
    assert secret not in row.last_error
    assert secret not in caplog.text
    figures.record(last_error=row.last_error)


@injects("a hand-inserted row whose payload nests 5,000 levels deep")
def test_row_whose_payload_nests_too_deep_for_python_is_dead_and_the_worker_keeps_running(
    fresh: Engine, migrated_url: str, figures: Figures
) -> None:
    """A payload PostgreSQL stores but Python cannot decode (nesting beyond the recursion limit)
    makes its job dead; the job claimed with it runs, and the worker keeps running."""
    too_deep = hand_insert(fresh, "bad_anything", deep(5_000))
    good = hand_insert(fresh, "bad_anything", '{"value": [[1]]}')
    with edge_app.running(worker(migrated_url)) as crashes:
        wait_running(crashes, lambda: ran[good] == 1, "the valid job runs")
        row = wait_running(
            crashes,
            lambda: (r := job_row(fresh, too_deep)) is not None and r.state == "dead" and r,
            "the deep row is dead",
        )
    assert row.attempts == 1
    figures.record(depth=5_000, dead=1)


def test_enqueue_refuses_a_payload_nested_too_deep_to_serialize(fresh: Engine) -> None:
    """Enqueue refuses a payload nested deeper than pydantic serializes, before any SQL."""
    value: list[Any] = []
    for _ in range(5_000):
        value = [value]
    with Session(fresh) as session:
        with pytest.raises(InvalidPayloadError):
            jobs.enqueue(session, Anything(value=value))
        assert session.execute(text("SELECT 1")).scalar_one() == 1
    assert stored(fresh) == 0


@injects("hand-inserted rows of a kind this worker has no handler for")
def test_unknown_kind_is_a_failure_with_backoff_and_the_worker_keeps_running(
    fresh: Engine, migrated_url: str, figures: Figures
) -> None:
    """A row of a kind the worker does not know, or knows without a handler, fails with the
    default backoff (2 s after the first failure), is not dead, and the jobs around it run."""
    unknown = hand_insert(fresh, "bad_no_such_kind", "{}")
    handlerless = hand_insert(fresh, "bad_enqueue_only", '{"n": 1}')
    good = hand_insert(fresh, "bad_order", '{"order_id": 1, "email": "a@example.com"}')
    with edge_app.running(worker(migrated_url)) as crashes:
        wait_running(crashes, lambda: ran[good] == 1, "the known job runs")

        def failed(job_id: int) -> Any:
            row = job_row(fresh, job_id)
            return row if row is not None and row.attempts == 1 and row.state == "pending" else None

        rows = [
            wait_running(crashes, lambda i=i: failed(i), "the failure")
            for i in (unknown, handlerless)
        ]
    for row in rows:
        assert "unknown kind" in row.last_error
        assert 0 < float(row.wait) <= 2.0
    figures.record(first_backoff_s=[round(float(r.wait), 2) for r in rows])


@injects("a strict pydantic model with datetime and UUID fields")
def test_worker_runs_a_strict_model_payload_that_enqueue_accepted(
    fresh: Engine, migrated_url: str, figures: Figures
) -> None:
    """A payload of a strict model (datetime and UUID fields) that enqueue accepted is run by the
    worker with the same values."""
    sent = Stamp(at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc), ref=uuid.uuid4())
    with Session(fresh) as session:
        job_id = jobs.enqueue(session, sent).id
        session.commit()
    with edge_app.running(worker(migrated_url)) as crashes:
        wait_running(
            crashes,
            lambda: job_id in stamps or (job_row(fresh, job_id) or (None,))[0] == "dead",
            "the job runs or dies",
        )
    assert stamps.get(job_id) == sent, job_row(fresh, job_id)
    figures.record(ran=1)


def test_testing_run_jobs_runs_a_strict_model_payload_that_enqueue_accepted(
    fresh: Engine,
) -> None:
    """testing.run_jobs runs a strict model's payload that enqueue accepted."""
    sent = Stamp(at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc), ref=uuid.uuid4())
    with Session(fresh) as session:
        job_id = jobs.enqueue(session, sent).id
        assert testing.run_jobs(jobs, session, queues=[QUEUE]).done == 1
        session.rollback()
    assert stamps[job_id] == sent


# -- hostile names (hypothesis) -------------------------------------------------------------------

INJECTIONS = [
    f"x'; DROP TABLE {SENTINEL}; --",
    f'x"; DROP TABLE {SENTINEL}; --',
    f"default'); DELETE FROM {SENTINEL}; --",
    "default; TRUNCATE sqla_jobs_job",
    "$$; DROP TABLE sqla_jobs_job; $$",
    "a\x00b",
    "\x00",
    "default\x00",
    "",
    " ",
    "default ",
    "-leading-dash",
    "_leading_underscore",
    "q" * 129,
    "é" * 64,
    "日本語のキュー名😀" * 200,
    "queue\nname",
    "back\\slash",
    "a/b",
    "a b",
]
HOSTILE = st.one_of(
    st.sampled_from(INJECTIONS),
    st.text(max_size=200),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=129, max_size=3000),
    st.tuples(
        st.text(max_size=20), st.sampled_from(["'", '"', ";", "\x00", "--", "$$", "\\", "\n"])
    ).map(lambda t: t[0] + t[1] + t[0]),
).filter(lambda name: not SAFE_NAME.fullmatch(name))


def assert_nothing_happened(session: Session, before: int) -> None:
    """The session's transaction is still usable, and holds only what it held before."""
    assert session.execute(select(func.count()).select_from(Job)).scalar_one() == before


@injects("hypothesis: queue names with quotes, semicolons, NUL, long unicode")
@FUZZ
@given(name=HOSTILE)
def test_hostile_queue_names_are_refused_before_any_sql(
    name: str, fresh: Engine, figures: Figures
) -> None:
    """A hostile queue name is refused by registration (RegistryError), enqueue and enqueue_many
    (InvalidQueueNameError), Worker (ConfigurationError) and Jobs(schema=...): nothing is written,
    the transaction stays usable, the sentinel table survives."""
    with pytest.raises(RegistryError):
        Jobs().register("fuzz_kind", Order, queue=name)
    with pytest.raises(ConfigurationError):
        Worker(jobs, NOWHERE, queues=[name])
    with pytest.raises(ConfigurationError):
        Jobs(schema=name)
    with Session(fresh) as session:
        jobs.enqueue(session, Order(order_id=1, email="a@example.com"))
        with pytest.raises(InvalidQueueNameError):
            jobs.enqueue(session, Order(order_id=2, email="b@example.com"), queue=name)
        with pytest.raises(InvalidQueueNameError):
            jobs.enqueue_many(session, [Order(order_id=3, email="c@example.com")], queue=name)
        assert_nothing_happened(session, 1)
        session.rollback()
    assert stored(fresh) == 0
    assert_sentinel(fresh)
    figures.record(examples=figures.values.get("examples", 0) + 1)


@injects("hypothesis: kind names with quotes, semicolons, NUL, long unicode")
@FUZZ
@given(name=HOSTILE)
def test_hostile_kind_names_are_refused_before_any_sql(
    name: str, fresh: Engine, figures: Figures
) -> None:
    """A hostile kind name is refused by registration (RegistryError, both forms) and by enqueue
    by name (UnknownKindError): nothing is written, the transaction stays usable, the sentinel
    table survives."""
    fuzz = Jobs()
    with pytest.raises(RegistryError):
        fuzz.register(name, Order)
    with pytest.raises(RegistryError):
        fuzz.kind(name, Note)(note)
    assert len(fuzz) == 0
    with Session(fresh) as session:
        with pytest.raises(UnknownKindError):
            jobs.enqueue(session, name, {"order_id": 1, "email": "a@example.com"})
        assert_nothing_happened(session, 0)
        jobs.enqueue(session, Order(order_id=1, email="a@example.com"))
        assert_nothing_happened(session, 1)
        session.rollback()
    assert stored(fresh) == 0
    assert_sentinel(fresh)
    figures.record(examples=figures.values.get("examples", 0) + 1)


@injects("hypothesis: arbitrary text (quotes, semicolons, NUL, unicode) in payloads and keys")
@FUZZ
@given(value=st.one_of(st.sampled_from(INJECTIONS), st.text(max_size=300)))
def test_any_text_in_a_payload_or_concurrency_key_is_stored_verbatim_or_refused(
    value: str, fresh: Engine, figures: Figures
) -> None:
    """Text in a payload and in a concurrency key is data: stored and read back verbatim, never
    executed. Text PostgreSQL cannot store (NUL) is refused with an EnqueueError before any SQL,
    and the transaction stays usable."""
    key = value[:256] or "k"
    with Session(fresh) as session:
        if "\x00" in value:
            with pytest.raises(InvalidPayloadError):
                jobs.enqueue(session, Note(text=value))
            with pytest.raises(InvalidOptionError):
                jobs.enqueue(session, Note(text="fine"), concurrency_key=key)
            assert_nothing_happened(session, 0)
        else:
            job_id = jobs.enqueue(session, Note(text=value), concurrency_key=key).id
            back = session.execute(
                text("SELECT payload->>'text', concurrency_key FROM sqla_jobs_job WHERE id = :id"),
                {"id": job_id},
            ).one()
            assert tuple(back) == (value, key)
        session.rollback()
    assert stored(fresh) == 0
    assert_sentinel(fresh)
    figures.record(examples=figures.values.get("examples", 0) + 1)


#: Text with at least one lone surrogate (what ``json.loads`` makes of an escaped half pair, and
#: what ``str`` holds after a ``surrogateescape`` decode): it has no UTF-8 form.
SURROGATE_TEXT = st.tuples(
    st.text(max_size=20),
    st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=3),
    st.text(alphabet=st.characters(exclude_categories=[]), max_size=20),
).map("".join)


def surrogate_inputs(value: str) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """Every text input of an enqueue holding ``value``: (the field the error must name, the kind
    name or None, the payload, the enqueue options)."""
    escaped = value.encode("unicode_escape").decode("ascii")
    return [
        ("kind", value, {"tenant": "t"}, {}),
        ("queue", "", Tenant(tenant="t"), {"queue": value}),
        ("concurrency key", "", Note(text="fine"), {"concurrency_key": value}),
        ("concurrency key", "", Tenant(tenant=escaped), {}),
        ("text", "", Note(text=value), {}),
        ("tags", "", Tenant(tenant="t", tags={value: "v"}), {}),
        ("tags", "", Tenant(tenant="t", tags={"k": value}), {}),
    ]


def fillers(count: int) -> list[BaseModel]:
    """Good payloads to put before the bad one."""
    return [Order(order_id=n, email="a@example.com") for n in range(count)]


def assert_refused(caught: pytest.ExceptionInfo[EnqueueError], field: str) -> None:
    assert isinstance(caught.value, EnqueueError)
    assert field in str(caught.value), f"{field!r} not named in {caught.value}"


@injects("hypothesis: lone surrogates in every text input, on every enqueue path")
@FUZZ
@given(value=SURROGATE_TEXT)
def test_a_lone_surrogate_in_any_text_input_is_refused_and_the_transaction_stays_usable(
    value: str, fresh: Engine, migrated_url: str, figures: Figures
) -> None:
    """A lone surrogate in a kind name, a queue, a concurrency key (given, or computed by the kind's
    key function) or any payload string (value or key) is refused with an EnqueueError naming the
    field, by enqueue and by enqueue_many below and above the COPY threshold, sync and async:
    nothing is written, and the job enqueued before it in the transaction commits."""
    refused = 0
    # Hypothesis runs every example with the same fixtures: the table keeps earlier examples' jobs.
    before = stored(fresh)
    with Session(fresh) as session:
        kept = jobs.enqueue(session, Order(order_id=1, email="a@example.com")).id
        for field, kind, payload, options in surrogate_inputs(value):
            args = (kind, payload) if kind else (payload,)
            with pytest.raises(EnqueueError) as caught:
                jobs.enqueue(session, *args, **options)
            assert_refused(caught, field)
            refused += 1
            if kind or "concurrency_key" in options:
                continue
            # Below the COPY threshold, at it, and past the first chunk (validated during the COPY).
            for count in (COPY_THRESHOLD - 1, COPY_THRESHOLD, CHUNK + 1):
                batch = [*fillers(count - 1), payload]
                with pytest.raises(EnqueueError) as caught:
                    jobs.enqueue_many(session, batch, **options)
                assert_refused(caught, field)
                refused += 1
        assert_nothing_happened(session, before + 1)
        session.commit()
    with fresh.connect() as conn:
        assert conn.execute(text("SELECT max(id) FROM sqla_jobs_job")).scalar() == kept

    async def in_async_session() -> int:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        done = 0
        try:
            async with AsyncSession(engine) as session:
                await jobs.enqueue_async(session, Order(order_id=2, email="b@example.com"))
                for field, kind, payload, options in surrogate_inputs(value):
                    args = (kind, payload) if kind else (payload,)
                    with pytest.raises(EnqueueError) as caught:
                        await jobs.enqueue_async(session, *args, **options)
                    assert_refused(caught, field)
                    done += 1
                    if kind or "concurrency_key" in options:
                        continue
                    for count in (COPY_THRESHOLD - 1, COPY_THRESHOLD * 2):
                        batch = [*fillers(count - 1), payload]
                        with pytest.raises(EnqueueError) as caught:
                            await jobs.enqueue_many_async(session, batch, **options)
                        assert_refused(caught, field)
                        done += 1
                jobs_now = await session.execute(select(func.count()).select_from(Job))
                assert jobs_now.scalar_one() == before + 2
                await session.rollback()
        finally:
            await engine.dispose()
        return done

    refused += asyncio.run(in_async_session())
    assert stored(fresh) == before + 1
    assert_sentinel(fresh)
    figures.record(examples=figures.values.get("examples", 0) + 1, refused=refused)
