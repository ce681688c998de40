"""A job's ``meta`` at enqueue, on every path (one INSERT, the bulk INSERT, COPY in one chunk and
streamed), sync and async; bad meta is refused before any SQL, leaving the transaction usable."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, event, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import EnqueueError, InvalidMetaError, Jobs
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.enqueue import row as _row
from sqla_jobs.enqueue.insert import CHUNK, COPY_THRESHOLD
from sqla_jobs.enqueue.validate import MAX_META_BYTES


class Ping(BaseModel):
    n: int


JOBS = Jobs()
JOBS.register("ping", Ping)

#: enqueue_many's paths: one INSERT, a COPY of one chunk, a COPY validated while it streams.
SIZES = (3, COPY_THRESHOLD, CHUNK + 1)
#: Values COPY's text format must escape, and text outside ASCII.
AWKWARD = {"tab": "a\tb", "newline": "a\nb", "backslash": "a\\b", "quote": 'say "hi"', "é": "ü"}


def stored_metas(engine: Engine, ids: list[int]) -> list[Any]:
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT id, meta FROM sqla_jobs_job WHERE id = ANY(:ids)"), {"ids": ids}
            ).all()
        )
    return [rows[i] for i in ids]


def test_enqueue_stores_meta_and_returns_it_on_the_job(clean: Engine) -> None:
    meta = {"tenant": "acme", "trace": {"id": "abc", "sampled": True}, **AWKWARD}
    with Session(clean) as session:
        job = JOBS.enqueue(session, Ping(n=1), meta=meta)
        plain = JOBS.enqueue(session, Ping(n=2))
        assert job.meta == meta
        assert plain.meta is None
        ids = [job.id, plain.id]
        session.commit()
    assert stored_metas(clean, ids) == [meta, None]


def test_an_enqueue_without_meta_sends_no_meta_parameter(clean: Engine) -> None:
    """The single INSERT leaves the optional meta column out when the job has none (its NULL
    parameter was a measurable cost), and sends it when it has one; the rate limiter's key,
    optional too, is sent only for a kind with a rate limit."""
    assert _row.OPTIONAL == ("meta", "rate_key"), "enqueue's lean INSERT tests these alone"
    sent: list[str] = []
    listen = event.listens_for(clean, "before_cursor_execute")

    @listen
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "INSERT INTO sqla_jobs_job" in statement:
            sent.append(statement)

    try:
        with Session(clean) as session:
            plain = JOBS.enqueue(session, Ping(n=1))
            tagged = JOBS.enqueue(session, Ping(n=2), meta={"a": 1})
            assert (plain.meta, tagged.meta) == (None, {"a": 1})
            ids = [plain.id, tagged.id]
            session.commit()
    finally:
        event.remove(clean, "before_cursor_execute", record)
    assert ["meta" in s for s in sent] == [False, True]
    assert "rate_key" not in sent[0]
    assert stored_metas(clean, ids) == [None, {"a": 1}]


@pytest.mark.parametrize("size", SIZES)
def test_enqueue_many_stores_one_meta_for_every_job(clean: Engine, size: int) -> None:
    meta = {"batch": "b1", **AWKWARD}
    with Session(clean) as session:
        ids = JOBS.enqueue_many(session, [Ping(n=i) for i in range(size)], meta=meta)
        session.commit()
    assert stored_metas(clean, ids) == [meta] * size


@pytest.mark.parametrize("size", SIZES)
def test_enqueue_many_stores_a_meta_per_job_and_null_where_none_is_given(
    clean: Engine, size: int
) -> None:
    metas: list[dict[str, Any] | None] = [
        None if i % 3 == 0 else {"i": i, "note": AWKWARD["tab"] if i % 2 else "x"}
        for i in range(size)
    ]
    with Session(clean) as session:
        ids = JOBS.enqueue_many(session, [Ping(n=i) for i in range(size)], meta=metas)
        session.commit()
    assert stored_metas(clean, ids) == metas


def test_enqueue_many_without_meta_stores_null_on_every_path(clean: Engine) -> None:
    with Session(clean) as session:
        ids = [i for size in SIZES for i in JOBS.enqueue_many(session, [Ping(n=1)] * size)]
        session.commit()
    assert stored_metas(clean, ids) == [None] * len(ids)


def test_async_enqueue_calls_store_meta_on_every_path(clean: Engine, migrated_url: str) -> None:
    async def main() -> list[int]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                ids = [(await JOBS.enqueue_async(session, Ping(n=0), meta={"k": 0})).id]
                for size in SIZES:
                    payloads = [Ping(n=i) for i in range(size)]
                    ids += await JOBS.enqueue_many_async(session, payloads, meta={"k": size})
                await session.commit()
                return ids
        finally:
            await engine.dispose()

    ids = asyncio.run(main())
    expected = [{"k": 0}] + [{"k": size} for size in SIZES for _ in range(size)]
    assert stored_metas(clean, ids) == expected


def test_meta_of_exactly_the_size_limit_is_accepted(clean: Engine) -> None:
    padding = MAX_META_BYTES - len('{"p":""}')
    with Session(clean) as session:
        job_id = JOBS.enqueue(session, Ping(n=1), meta={"p": "x" * padding}).id
        session.commit()
    assert stored_metas(clean, [job_id]) == [{"p": "x" * padding}]


class Opaque:
    pass


BAD_META: dict[str, tuple[Any, str]] = {
    "a set": ({1, 2}, "must be a mapping"),
    "a str key that is an int": ({1: "a"}, "not a str: 1"),
    "a nested non-str key": ({"a": [{"b": {True: 1}}]}, "not a str: True"),
    "an object": ({"a": Opaque()}, "not JSON-serializable"),
    "NaN": ({"a": float("nan")}, "not JSON-serializable"),
    "a NUL": ({"a": "x\x00y"}, "NUL character"),
    "a lone surrogate": ({"a": "\ud800"}, "lone surrogate"),
    "too large": ({"p": "x" * MAX_META_BYTES}, "over the limit of 8192"),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_bad_meta_is_refused_before_any_sql_and_the_transaction_stays_usable(
    clean: Engine, case: str
) -> None:
    meta, message = BAD_META[case]
    with Session(clean) as session:
        kept = JOBS.enqueue(session, Ping(n=0)).id
        with pytest.raises(InvalidMetaError, match=message):
            JOBS.enqueue(session, Ping(n=1), meta=meta)
        for size in SIZES:
            with pytest.raises(InvalidMetaError, match=message):
                JOBS.enqueue_many(session, [Ping(n=i) for i in range(size)], meta=meta)
            per_job = [None] * (size - 1) + [meta]
            with pytest.raises(InvalidMetaError, match=f"meta of payload {size - 1} "):
                JOBS.enqueue_many(session, [Ping(n=i) for i in range(size)], meta=per_job)
        session.commit()
    with clean.connect() as conn:
        assert list(conn.scalars(text("SELECT id FROM sqla_jobs_job"))) == [kept]


def test_a_per_job_meta_list_of_the_wrong_length_or_a_str_is_refused(clean: Engine) -> None:
    with Session(clean) as session:
        with pytest.raises(InvalidMetaError, match="meta has 1 entries for 2 payloads"):
            JOBS.enqueue_many(session, [Ping(n=1), Ping(n=2)], meta=[{"a": 1}])
        with pytest.raises(EnqueueError, match="must be a mapping"):
            JOBS.enqueue_many(session, [Ping(n=1)], meta="tenant=acme")
        assert session.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 0
