"""Unique jobs against a real PostgreSQL: one job per key among the states that count, held by the
unique index, and a duplicate never aborts the caller's transaction."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sqla_jobs import (
    DuplicateJobError,
    EnqueuedIds,
    InvalidOptionError,
    Job,
    Jobs,
    RegistryError,
    Unique,
    UniqueKeyTakenError,
    testing,
)
from sqla_jobs.enqueue.insert import COPY_THRESHOLD
from tests._waiting import DEADLINE

UTC = timezone.utc


class Refresh(BaseModel):
    order_id: int
    reason: str = ""


class Report(BaseModel):
    day: str


class Sweep(BaseModel):
    pass


class Plain(BaseModel):
    n: int


class Flaky(BaseModel):
    n: int


JOBS = Jobs()
JOBS.register("refresh", Refresh, unique=Unique(by=("order_id",)))
JOBS.register("report", Report, unique=Unique(states=("pending", "running", "dead")))
JOBS.register("sweep", Sweep, unique=Unique(by=(), period=timedelta(hours=1)))
JOBS.register("plain", Plain)
FLAKY_CALLS: list[int] = []


@JOBS.kind("flaky", Flaky, unique=True, max_attempts=3)
def flaky(payload: Flaky, ctx: object) -> None:
    FLAKY_CALLS.append(payload.n)
    if len(FLAKY_CALLS) == 1:
        raise RuntimeError("first run fails")


def rows(engine: Engine) -> list[tuple[int, str, str, str | None]]:
    with engine.connect() as conn:
        return [
            (r.id, r.kind, r.state, r.unique_key)
            for r in conn.execute(
                text("SELECT id, kind, state, unique_key FROM sqla_jobs_job ORDER BY id")
            )
        ]


def set_state(engine: Engine, job_id: int, state: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sqla_jobs_job SET state = :s, finished_at = now() WHERE id = :i"),
            {"s": state, "i": job_id},
        )


# -- one enqueue ------------------------------------------------------------------------------


def test_a_second_enqueue_of_a_key_returns_the_job_holding_it_and_inserts_nothing(
    clean: Engine,
) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        first = JOBS.enqueue(session, Refresh(order_id=1, reason="created"))
    with Session(clean, expire_on_commit=False) as session, session.begin():
        again = JOBS.enqueue(session, Refresh(order_id=1, reason="paid"))
        assert again.id == first.id
        assert again.inserted is False
        assert again.payload == {"order_id": 1, "reason": "created"}
        other = JOBS.enqueue(session, Refresh(order_id=2))
        assert other.inserted is True
    assert first.inserted is True
    assert [r[3] for r in rows(clean)] == ['refresh:{"order_id":1}', 'refresh:{"order_id":2}']


def test_a_duplicate_in_the_same_transaction_is_found_and_the_transaction_commits(
    clean: Engine,
) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        first = JOBS.enqueue(session, Refresh(order_id=7))
        assert first.inserted is True
        second = JOBS.enqueue(session, Refresh(order_id=7))
        # The Session's own object: the flag tells what the last enqueue returning it did.
        assert second is first
        assert second.inserted is False
        session.execute(text("SELECT 1"))  # still usable
    assert len(rows(clean)) == 1


def test_on_conflict_raise_refuses_and_leaves_the_transaction_usable(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        held = JOBS.enqueue(session, Refresh(order_id=3))
    with Session(clean, expire_on_commit=False) as session, session.begin():
        plain = JOBS.enqueue(session, Plain(n=1))
        with pytest.raises(DuplicateJobError, match=f"job {held.id}") as caught:
            JOBS.enqueue(session, Refresh(order_id=3), on_conflict="raise")
        assert caught.value.existing_ids == [held.id]
        after = JOBS.enqueue(session, Plain(n=2))
    assert {r[0] for r in rows(clean)} == {held.id, plain.id, after.id}


def test_on_conflict_replace_updates_a_pending_holder_but_never_a_running_one(
    clean: Engine,
) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        held = JOBS.enqueue(session, Refresh(order_id=4, reason="a"), delay=3600)
    later = datetime(2040, 1, 1, tzinfo=UTC)
    with Session(clean, expire_on_commit=False) as session, session.begin():
        replaced = JOBS.enqueue(
            session,
            Refresh(order_id=4, reason="b"),
            run_at=later,
            priority=5,
            on_conflict="replace",
        )
        assert (replaced.id, replaced.inserted, replaced.replaced) == (held.id, False, True)
        assert (replaced.payload["reason"], replaced.run_at, replaced.priority) == ("b", later, 5)
    set_state_running(clean, held.id)
    with Session(clean, expire_on_commit=False) as session, session.begin():
        kept = JOBS.enqueue(session, Refresh(order_id=4, reason="c"), on_conflict="replace")
        assert (kept.id, kept.inserted, kept.replaced) == (held.id, False, False)
        assert kept.payload["reason"] == "b"


def set_state_running(engine: Engine, job_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'running', lease_token = gen_random_uuid(), "
                "lease_expires_at = now() + interval '1 minute' WHERE id = :i"
            ),
            {"i": job_id},
        )


def test_a_key_is_free_again_once_its_job_leaves_the_counted_states(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        first = JOBS.enqueue(session, Refresh(order_id=5))
        report = JOBS.enqueue(session, Report(day="2026-12-01"))
    set_state(clean, first.id, "dead")  # dead does not count for refresh
    set_state(clean, report.id, "dead")  # ... but does for report
    with Session(clean, expire_on_commit=False) as session, session.begin():
        second = JOBS.enqueue(session, Refresh(order_id=5))
        again = JOBS.enqueue(session, Report(day="2026-12-01"))
    assert second.inserted
    assert second.id != first.id
    assert not again.inserted
    assert again.id == report.id


def test_an_explicit_unique_key_makes_any_kind_unique_by_that_key(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        a = JOBS.enqueue(session, Plain(n=1), unique_key="import-42")
        b = JOBS.enqueue(session, Plain(n=2), unique_key="import-42")
        c = JOBS.enqueue(session, Plain(n=3), unique_key="import-43")
        d = JOBS.enqueue(session, Plain(n=1))  # no key: not unique
    assert (b.id, b.inserted) == (a.id, False)
    assert c.inserted
    assert d.inserted
    assert a.unique_key == "plain:import-42"
    assert a.unique_states == ["pending", "running", "waiting"]


def test_a_period_makes_one_job_per_window_of_run_at(clean: Engine) -> None:
    ten = datetime(2031, 1, 1, 10, 0, tzinfo=UTC)
    with Session(clean, expire_on_commit=False) as session, session.begin():
        a = JOBS.enqueue(session, Sweep(), run_at=ten + timedelta(minutes=5))
        b = JOBS.enqueue(session, Sweep(), run_at=ten + timedelta(minutes=55))
        c = JOBS.enqueue(session, Sweep(), run_at=ten + timedelta(minutes=65))
        d = JOBS.enqueue(session, Sweep())  # now: another window
    assert (b.id, b.inserted) == (a.id, False)
    assert c.inserted
    assert d.inserted
    assert a.unique_key == f"sweep:{{}}@{int(ten.timestamp())}"


def test_unique_declarations_are_checked_at_registration() -> None:
    jobs = Jobs()
    with pytest.raises(RegistryError, match="names 'order', not fields of Refresh"):
        jobs.register("r1", Refresh, unique=Unique(by=("order",)))
    with pytest.raises(RegistryError, match="unknown state"):
        jobs.register("r2", Refresh, unique=Unique(states=("done",)))
    with pytest.raises(RegistryError, match="whole seconds"):
        jobs.register("r3", Refresh, unique=Unique(period=timedelta(milliseconds=1500)))
    kind = jobs.register("r4", Refresh, unique=Unique(states=("dead",)))
    assert kind.options.unique is not None
    assert kind.options.unique.states == ("pending", "running", "dead", "waiting")


def test_a_bad_on_conflict_or_unique_key_raises_before_any_sql(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        with pytest.raises(InvalidOptionError, match="on_conflict"):
            JOBS.enqueue(session, Refresh(order_id=1), on_conflict="ignore")  # type: ignore[arg-type]
        with pytest.raises(InvalidOptionError, match="unique_key"):
            JOBS.enqueue(session, Plain(n=1), unique_key="")
        JOBS.enqueue(session, Plain(n=1))
    assert len(rows(clean)) == 1


# -- enqueue_many -------------------------------------------------------------------------------


def test_enqueue_many_folds_duplicates_and_says_which_were_inserted(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        held = JOBS.enqueue(session, Refresh(order_id=1))
    payloads = [
        Refresh(order_id=1),  # held by an existing job
        Plain(n=1),
        Refresh(order_id=2),
        Refresh(order_id=2, reason="again"),  # duplicate within the batch
        Plain(n=2),
    ]
    with Session(clean, expire_on_commit=False) as session, session.begin():
        ids = JOBS.enqueue_many(session, payloads)
    assert isinstance(ids, EnqueuedIds)
    assert ids.inserted == [False, True, True, False, True]
    assert ids[0] == held.id
    assert ids[2] == ids[3]
    assert ids.duplicates == [0, 3]
    assert sorted(r[0] for r in rows(clean)) == sorted({held.id, ids[1], ids[2], ids[4]})


def test_enqueue_many_mixes_unique_jobs_with_a_copy_sized_plain_batch(clean: Engine) -> None:
    payloads: list[BaseModel] = [Plain(n=i) for i in range(COPY_THRESHOLD * 2)]
    payloads[10:10] = [Refresh(order_id=i % 3) for i in range(9)]
    with Session(clean, expire_on_commit=False) as session, session.begin():
        ids = JOBS.enqueue_many(session, payloads)
    assert sum(ids.inserted) == COPY_THRESHOLD * 2 + 3
    assert len(rows(clean)) == COPY_THRESHOLD * 2 + 3
    assert len(set(ids)) == COPY_THRESHOLD * 2 + 3


def test_enqueue_many_on_conflict_raise_writes_nothing(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        JOBS.enqueue(session, Refresh(order_id=9))
    with Session(clean, expire_on_commit=False) as session, session.begin():
        with pytest.raises(DuplicateJobError, match="payload 1"):
            JOBS.enqueue_many(
                session,
                [Plain(n=1), Refresh(order_id=9), Refresh(order_id=10)],
                on_conflict="raise",
            )
        with pytest.raises(DuplicateJobError, match="payload 2"):
            JOBS.enqueue_many(
                session,
                [Refresh(order_id=11), Plain(n=1), Refresh(order_id=11)],
                on_conflict="raise",
            )
        JOBS.enqueue(session, Plain(n=5))
    assert [r[1] for r in rows(clean)] == ["refresh", "plain"]


def test_enqueue_many_on_conflict_replace_takes_the_last_payload_of_a_key(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        held = JOBS.enqueue(session, Refresh(order_id=1, reason="old"))
    with Session(clean, expire_on_commit=False) as session, session.begin():
        ids = JOBS.enqueue_many(
            session,
            [Refresh(order_id=1, reason="x"), Refresh(order_id=1, reason="y"), Refresh(order_id=2)],
            on_conflict="replace",
        )
    assert ids == [held.id, held.id, ids[2]]
    assert ids.replaced == [False, True, False]
    assert ids.inserted == [False, False, True]
    with Session(clean, expire_on_commit=False) as session:
        assert session.get(Job, held.id).payload["reason"] == "y"  # type: ignore[union-attr]


def test_enqueue_many_without_unique_kinds_returns_all_inserted(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        ids = JOBS.enqueue_many(session, [Plain(n=1), Plain(n=2)])
    assert ids.inserted == [True, True]
    assert ids.duplicates == []


# -- transactions and isolation ---------------------------------------------------------------


def test_a_second_enqueuer_waits_for_the_first_transaction_then_finds_or_inserts(
    clean: Engine,
) -> None:
    """Committed: the waiter finds the job. Rolled back: the waiter inserts its own."""
    for outcome in ("commit", "rollback"):
        with Session(clean, expire_on_commit=False) as first:
            first.begin()
            mine = JOBS.enqueue(first, Refresh(order_id=77))
            got: list[Job] = []
            waiter = threading.Thread(target=lambda out=got: out.append(enqueue_alone(clean, 77)))
            waiter.start()
            wait_for_lock_wait(clean)
            assert waiter.is_alive()
            first.commit() if outcome == "commit" else first.rollback()
            waiter.join(DEADLINE)
        assert len(got) == 1
        if outcome == "commit":
            assert got[0].id == mine.id
            assert got[0].inserted is False
        else:
            assert got[0].inserted is True
        with clean.begin() as conn:
            conn.execute(text("TRUNCATE sqla_jobs_job"))


def enqueue_alone(engine: Engine, order_id: int) -> Job:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return JOBS.enqueue(session, Refresh(order_id=order_id))


def wait_for_lock_wait(engine: Engine) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            waiting = conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )
        if waiting:
            return
        time.sleep(0.01)
    raise AssertionError("the second enqueuer never waited on the first")


def test_repeatable_read_enqueuer_gets_a_serialization_failure_on_a_key_taken_since(
    clean: Engine,
) -> None:
    with Session(clean, expire_on_commit=False) as session:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        session.execute(text("SELECT 1"))  # the snapshot is taken
        enqueue_alone(clean, 88)
        with pytest.raises(OperationalError, match="could not serialize"):
            JOBS.enqueue(session, Refresh(order_id=88))
        session.rollback()
    assert len(rows(clean)) == 1


# -- operations and the worker ----------------------------------------------------------------


def test_retry_of_a_job_whose_key_is_taken_says_so_and_changes_nothing(clean: Engine) -> None:
    with Session(clean, expire_on_commit=False) as session, session.begin():
        dead = JOBS.enqueue(session, Refresh(order_id=6))
    set_state(clean, dead.id, "dead")
    with Session(clean, expire_on_commit=False) as session, session.begin():
        holder = JOBS.enqueue(session, Refresh(order_id=6))
        other = JOBS.enqueue(session, Plain(n=1))
    set_state(clean, other.id, "dead")
    with Session(clean, expire_on_commit=False) as session, session.begin():
        with pytest.raises(UniqueKeyTakenError, match=f"job {dead.id}.*job {holder.id}") as caught:
            JOBS.retry(session, [dead.id, other.id])
        assert caught.value.held == {dead.id: holder.id}
        # By filter: the others are retried, the one whose key is taken stays dead.
        assert JOBS.retry(session) == [other.id]
    assert {r[0]: r[2] for r in rows(clean)} == {
        dead.id: "dead",
        holder.id: "pending",
        other.id: "pending",
    }


def test_retry_of_two_dead_jobs_sharing_a_key_refuses_the_second(clean: Engine) -> None:
    ids = []
    for _ in range(2):
        with Session(clean, expire_on_commit=False) as session, session.begin():
            ids.append(JOBS.enqueue(session, Refresh(order_id=8)).id)
        set_state(clean, ids[-1], "dead")
    with Session(clean, expire_on_commit=False) as session, session.begin():
        with pytest.raises(UniqueKeyTakenError):
            JOBS.retry(session, ids)
        assert JOBS.retry(session, ids[:1]) == ids[:1]


def test_a_unique_job_fails_is_retried_and_completes_without_a_unique_violation(
    clean: Engine,
) -> None:
    FLAKY_CALLS.clear()
    with Session(clean, expire_on_commit=False) as session, session.begin():
        job = JOBS.enqueue(session, Flaky(n=1))
    with Session(clean, expire_on_commit=False) as session, session.begin():
        # all_jobs: the job was committed by another transaction, not written by this one.
        result = testing.run_jobs(JOBS, session, raise_errors=False, all_jobs=True)
        assert len(result.errors) == 1
        session.execute(text("UPDATE sqla_jobs_job SET run_at = now()"))
        # Pending again after the failure: it still holds its key.
        assert not JOBS.enqueue(session, Flaky(n=1)).inserted
        testing.run_jobs(JOBS, session)
    assert FLAKY_CALLS == [1, 1]
    assert rows(clean) == []
    with Session(clean, expire_on_commit=False) as session, session.begin():
        assert JOBS.enqueue(session, Flaky(n=1)).id != job.id


def test_async_enqueue_of_unique_jobs(migrated_url: str, clean: Engine) -> None:
    import asyncio

    from sqla_jobs.db.urls import sqlalchemy_url

    async def main() -> tuple[bool | None, Job, Job, EnqueuedIds]:
        engine = create_async_engine(sqlalchemy_url(migrated_url))
        try:
            async with AsyncSession(engine, expire_on_commit=False) as session, session.begin():
                a = await JOBS.enqueue_async(session, Refresh(order_id=1))
                first = a.inserted
                b = await JOBS.enqueue_async(session, Refresh(order_id=1))
                many = await JOBS.enqueue_many_async(session, [Refresh(order_id=1), Plain(n=1)])
                return first, a, b, many
        finally:
            await engine.dispose()

    first, a, b, many = asyncio.run(main())
    assert (first, b.inserted, b.id) == (True, False, a.id)
    assert many.inserted == [False, True]
    assert many[0] == a.id


def test_processes_racing_on_the_same_keys_commit_exactly_one_job_per_key(
    migrated_url: str, clean: Engine
) -> None:
    """Six processes, 40 transactions each over 12 keys, a third rolled back, single enqueues and
    shuffled batches: no deadlock, no unique violation, one job per key committed."""
    import multiprocessing

    from sqla_jobs.db.urls import sqlalchemy_url
    from tests.integration._unique_enqueuers import enqueue_rounds

    url = sqlalchemy_url(migrated_url)
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        results = pool.starmap(enqueue_rounds, [(url, seed, 12, 40) for seed in range(6)])
    committed = set().union(*(keys for keys, _ in results))
    with clean.connect() as conn:
        found = conn.execute(
            text("SELECT payload->>'key', count(*) FROM sqla_jobs_job GROUP BY 1")
        ).all()
    assert {int(k): n for k, n in found} == dict.fromkeys(committed, 1)
    assert sum(inserted for _, inserted in results) == len(committed)
