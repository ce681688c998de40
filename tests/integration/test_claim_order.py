"""The claims' loose index scans: priority order, per-queue FIFO, nothing early, nothing extra
locked, pauses and the crash rule kept, and the idle poll's one probe for all queues."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Jobs
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql.compiled import WorkerSQL

from ._workers import running_workers, wait_until

SQL = WorkerSQL(None)
Conn = psycopg.Connection[tuple[Any, ...]]


def _insert(engine: Engine, queue: str, priority: int, seconds: int, **extra: object) -> int:
    """A pending job of ``queue`` due ``seconds`` from now (negative: already due); its id."""
    columns = {"queue": queue, "priority": priority, "seconds": seconds, **extra}
    names = ", ".join(k for k in extra)
    values = ", ".join(f":{k}" for k in extra)
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at"
                    f"{', ' + names if names else ''}) VALUES (:queue, 'k', '{{}}', :priority,"
                    f" now() + :seconds * interval '1 second'{', ' + values if values else ''})"
                    " RETURNING id"
                ),
                columns,
            ).scalar_one()
        )


@pytest.fixture
def conns(migrated_url: str) -> Iterator[tuple[Conn, Conn]]:
    with (
        psycopg.connect(libpq_conninfo(migrated_url)) as a,
        psycopg.connect(libpq_conninfo(migrated_url)) as b,
    ):
        yield a, b


def _claim(conn: Conn, queue: str, limit: int, **crash: bool) -> list[int]:
    params = SQL.claim.params(
        queue=queue, limit=limit, lease=timedelta(seconds=60), worker="t", **crash
    )
    return [int(r[0]) for r in conn.execute(SQL.claim.sql, params)]


def _keyed_claim(conn: Conn, queue: str, limit: int) -> list[tuple[int, str]]:
    keys = [r[0] for r in conn.execute(SQL.lock_keys.sql, {"queue": queue, "scan": limit})]
    params = SQL.claim_keyed.params(
        queue=queue, keys=keys, limit=limit, lease=timedelta(seconds=60), worker="t"
    )
    return [(int(r[0]), str(r[12])) for r in conn.execute(SQL.claim_keyed.sql, params)]


def _probe(conn: Conn, queues: list[str], keyed: bool = True) -> list[str]:
    params = SQL.claimable_queues.params(queues=queues, keyed=keyed)
    return [str(r[0]) for r in conn.execute(SQL.claimable_queues.sql, params) if r[1]]


def test_claims_come_in_priority_then_fifo_order_past_scheduled_jobs(
    clean: Engine, conns: tuple[Conn, Conn]
) -> None:
    a, _ = conns
    due: list[tuple[int, int, int]] = []
    for priority in (2, 0, 1):
        for seconds in (-30, 3600, -10, 7200, -20):
            job = _insert(clean, "q", priority, seconds)
            if seconds < 0:
                due.append((priority, seconds, job))
    _insert(clean, "other", 0, -100)
    expected = [job for _, _, job in sorted(due)]
    taken = []
    for _ in range(len(expected)):
        taken += _claim(a, "q", 1)
        a.commit()
    assert taken == expected
    assert _claim(a, "q", 10) == []


def test_one_claim_returns_its_jobs_in_claim_order_across_priorities(
    clean: Engine, conns: tuple[Conn, Conn]
) -> None:
    a, _ = conns
    ids = [_insert(clean, "q", p, s) for p, s in ((1, -5), (0, 60), (0, -1), (1, -9), (3, -2))]
    assert _claim(a, "q", 10) == [ids[2], ids[3], ids[0], ids[4]]


def test_a_claim_locks_no_row_past_its_limit(clean: Engine, conns: tuple[Conn, Conn]) -> None:
    a, b = conns
    ids = [_insert(clean, "q", p, -10 + i) for i, p in enumerate((0, 0, 0, 1, 1))]
    assert _claim(a, "q", 2) == ids[:2]
    # A's transaction is still open: a second worker takes everything A did not claim.
    assert _claim(b, "q", 10) == ids[2:]
    a.rollback()
    b.rollback()


def test_jobs_scheduled_for_later_are_never_claimed_early(
    clean: Engine, conns: tuple[Conn, Conn]
) -> None:
    a, _ = conns
    for priority in (0, 1, 2):
        _insert(clean, "q", priority, 60)
        _insert(clean, "q", priority, 60, concurrency_key="k", concurrency_limit=1)
    assert _claim(a, "q", 10) == []
    assert _keyed_claim(a, "q", 10) == []
    assert _probe(a, ["q"]) == []


def test_a_paused_queue_is_neither_claimed_nor_probed(
    clean: Engine, conns: tuple[Conn, Conn]
) -> None:
    a, _ = conns
    _insert(clean, "paused", 0, -1)
    _insert(clean, "paused", 0, -1, concurrency_key="k", concurrency_limit=1)
    jobs = Jobs()
    with Session(clean) as s, s.begin():
        jobs.pause_queue(s, "paused")
    try:
        assert _claim(a, "paused", 10) == []
        assert _keyed_claim(a, "paused", 10) == []
        assert _probe(a, ["paused"]) == []
        a.rollback()
    finally:
        with Session(clean) as s, s.begin():
            jobs.resume_queue(s, "paused")
    assert len(_claim(a, "paused", 10)) == 1
    assert len(_keyed_claim(a, "paused", 10)) == 1


def test_the_crash_rule_steps_over_crashed_jobs_at_the_head(
    clean: Engine, conns: tuple[Conn, Conn]
) -> None:
    a, _ = conns
    last_life = _insert(clean, "q", 0, -30, crashes=2, max_crashes=3)
    crashed = _insert(clean, "q", 0, -20, crashes=1, max_crashes=3)
    healthy = _insert(clean, "q", 1, -10)
    assert _claim(a, "q", 10, last_life_ok=False, crashed_ok=False) == [healthy]
    a.rollback()
    assert _claim(a, "q", 10, last_life_ok=False) == [crashed, healthy]
    a.rollback()
    assert _claim(a, "q", 10) == [last_life, crashed, healthy]
    a.rollback()


def test_keyed_claim_finds_due_jobs_behind_scheduled_ones_and_keeps_limits(
    clean: Engine, conns: tuple[Conn, Conn]
) -> None:
    a, _ = conns
    # Key "a": only scheduled jobs at priority 0, due ones at priority 1; key "b": due at 0.
    _insert(clean, "q", 0, 60, concurrency_key="a", concurrency_limit=2)
    a1 = _insert(clean, "q", 1, -5, concurrency_key="a", concurrency_limit=2)
    a2 = _insert(clean, "q", 1, -4, concurrency_key="a", concurrency_limit=2)
    _insert(clean, "q", 1, -3, concurrency_key="a", concurrency_limit=2)
    b1 = _insert(clean, "q", 0, -1, concurrency_key="b", concurrency_limit=1)
    _insert(clean, "q", 0, 0, concurrency_key="b", concurrency_limit=1)
    # Key "b"'s head has the better priority; each key takes up to its limit, in per-key order.
    assert _keyed_claim(a, "q", 10) == [(b1, "b"), (a1, "a"), (a2, "a")]
    a.commit()
    assert _keyed_claim(a, "q", 10) == []
    a.commit()


def test_the_probe_lists_the_queues_with_due_jobs_in_the_order_given(
    clean: Engine, conns: tuple[Conn, Conn]
) -> None:
    a, _ = conns
    _insert(clean, "unkeyed", 2, 60)
    _insert(clean, "unkeyed", 3, -1)
    _insert(clean, "keyed", 0, 60, concurrency_key="x", concurrency_limit=1)
    _insert(clean, "keyed", 0, -1, concurrency_key="y", concurrency_limit=1)
    _insert(clean, "later", 0, 60)
    queues = ["later", "keyed", "empty", "unkeyed"]
    assert _probe(a, queues) == ["keyed", "unkeyed"]
    assert _probe(a, queues, keyed=False) == ["unkeyed"]


class One(BaseModel):
    n: int


class Two(BaseModel):
    n: int


class Three(BaseModel):
    n: int


def test_the_idle_poll_claims_in_every_queue_with_due_jobs_and_not_early(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    done: list[tuple[str, int]] = []
    models: dict[str, type[BaseModel]] = {"one": One, "two": Two, "three": Three}
    for queue, model in models.items():

        def handler(args: Any, ctx: object, queue: str = queue) -> None:
            done.append((queue, args.n))

        jobs.register(f"item_{queue}", model, handler, queue=queue)
    with running_workers(jobs, migrated_url, poll_interval=0.1) as (worker,):
        # The listener's first look has been acted on and found nothing; the jobs are then
        # inserted without a NOTIFY: only the poll can find them.
        listener = worker.listener
        assert listener is not None
        wait_until(listener.connected.is_set, what="the listener is connected")

        def idle() -> bool:
            wakeups = worker.wakeups
            return wakeups is not None and wakeups.drained and not wakeups.pending

        wait_until(idle, what="the worker is idle")
        with clean.begin() as conn:
            for queue, seconds in (("one", -1), ("two", -1), ("three", 3600)):
                conn.execute(
                    text(
                        "INSERT INTO sqla_jobs_job (queue, kind, payload, run_at) VALUES"
                        " (:q, :kind, '{\"n\": 1}', now() + :s * interval '1 second')"
                    ),
                    {"q": queue, "kind": f"item_{queue}", "s": seconds},
                )
        wait_until(lambda: len(done) == 2, what="both due jobs ran")
    assert sorted(done) == [("one", 1), ("two", 1)]
    with clean.connect() as conn:
        state = conn.execute(text("SELECT state FROM sqla_jobs_job WHERE queue = 'three'"))
        assert state.scalar_one() == "pending"
