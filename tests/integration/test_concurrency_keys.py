"""Per-key concurrency limits: exact across workers, FIFO per key at N = 1, no head-of-line."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_jobs import InvalidOptionError, Jobs, RegistryError, testing
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.sql.compiled import WorkerSQL

from ._workers import queue_empty, running_workers, wait_until


class Keyed(BaseModel):
    customer: int
    seq: int
    ms: int = 0


class Free(BaseModel):
    n: int


Interval = tuple[float, float, int]


def _recording_jobs(limit: int) -> tuple[Jobs, dict[str, list[Interval]]]:
    jobs = Jobs()
    runs: dict[str, list[Interval]] = defaultdict(list)
    lock = threading.Lock()

    @jobs.kind("keyed", Keyed, concurrency_key=lambda p: f"c{p.customer}", concurrency_limit=limit)
    def keyed(args: Keyed, ctx: object) -> None:
        start = time.monotonic()
        time.sleep(args.ms / 1000)
        with lock:
            runs[f"c{args.customer}"].append((start, time.monotonic(), args.seq))

    return jobs, runs


def _max_overlap(intervals: list[Interval]) -> int:
    events = sorted([(s, 1) for s, _, _ in intervals] + [(e, -1) for _, e, _ in intervals])
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


def test_limit_one_runs_each_key_alone_and_in_enqueue_order(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = _recording_jobs(limit=1)
    rng = random.Random(1)
    with Session(clean) as s, s.begin():
        jobs.enqueue_many(
            s, [Keyed(customer=i % 8, seq=i // 8, ms=rng.randint(0, 8)) for i in range(320)]
        )
    with running_workers(jobs, migrated_url, count=3, concurrency=6, poll_interval=0.2):
        wait_until(queue_empty(clean), 60, "all keyed jobs to finish")
    assert sorted(runs) == [f"c{i}" for i in range(8)]
    for key, intervals in runs.items():
        assert len(intervals) == 40, key
        assert _max_overlap(intervals) == 1, f"{key} ran two jobs at once"
        seqs = [seq for _, _, seq in sorted(intervals)]
        assert seqs == sorted(seqs), f"{key} ran out of enqueue order"


def test_limit_two_never_exceeds_two_per_key_and_does_use_both(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = _recording_jobs(limit=2)
    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Keyed(customer=i % 3, seq=i, ms=25) for i in range(60)])
    with running_workers(jobs, migrated_url, count=2, concurrency=8, poll_interval=0.2):
        wait_until(queue_empty(clean), 60, "all keyed jobs to finish")
    overlaps = {key: _max_overlap(iv) for key, iv in runs.items()}
    assert all(o <= 2 for o in overlaps.values()), overlaps
    assert max(overlaps.values()) == 2, "the limit of 2 was never used: keys were serialized"


def test_a_hot_key_does_not_block_other_keys_or_unkeyed_jobs(
    clean: Engine, migrated_url: str
) -> None:
    jobs, runs = _recording_jobs(limit=1)
    free_done: list[float] = []

    @jobs.kind("free", Free)
    def free(args: Free, ctx: object) -> None:
        free_done.append(time.monotonic())

    with Session(clean) as s, s.begin():
        # The hot key's backlog is first in line (lowest ids, earliest run_at).
        jobs.enqueue_many(s, [Keyed(customer=0, seq=i, ms=100) for i in range(10)])
        jobs.enqueue_many(s, [Keyed(customer=1 + i, seq=0) for i in range(5)])
        jobs.enqueue_many(s, [Free(n=i) for i in range(20)])
    with running_workers(jobs, migrated_url, count=1, concurrency=4, poll_interval=0.2):
        wait_until(queue_empty(clean), 30, "all jobs to finish")
    hot_end = max(end for _, end, _ in runs["c0"])
    others_end = max(end for key, iv in runs.items() if key != "c0" for _, end, _ in iv)
    assert others_end < hot_end - 0.5, "other keys waited behind the hot key"
    assert len(free_done) == 20
    assert max(free_done) < hot_end - 0.5


def test_two_claimers_of_one_key_cannot_both_win(clean: Engine, migrated_url: str) -> None:
    jobs, _ = _recording_jobs(limit=1)
    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Keyed(customer=7, seq=i) for i in range(3)])
    sql = WorkerSQL(None)
    params = {"queue": "default", "lease": "60 seconds", "worker": "t"}
    with (
        psycopg.connect(libpq_conninfo(migrated_url)) as a,
        psycopg.connect(libpq_conninfo(migrated_url)) as b,
    ):
        keys_a = a.execute(sql.lock_keys.sql, sql.lock_keys.params(queue="default", scan=5))
        assert [r[0] for r in keys_a] == ["c7"]
        # B does not wait for A's advisory lock: it skips the key.
        keys_b = b.execute(sql.lock_keys.sql, sql.lock_keys.params(queue="default", scan=5))
        assert keys_b.fetchall() == []
        b.rollback()
        won = a.execute(sql.claim_keyed.sql, sql.claim_keyed.params(keys=["c7"], limit=5, **params))
        assert len(won.fetchall()) == 1
        a.commit()
        # Now B gets the lock, and its snapshot (taken after the lock) sees A's running job.
        assert [
            r[0]
            for r in b.execute(sql.lock_keys.sql, sql.lock_keys.params(queue="default", scan=5))
        ] == ["c7"]
        lost = b.execute(
            sql.claim_keyed.sql, sql.claim_keyed.params(keys=["c7"], limit=5, **params)
        )
        assert lost.fetchall() == []
        b.commit()


def test_per_call_key_needs_a_kind_with_a_limit(clean: Engine) -> None:
    jobs = Jobs()
    jobs.register("plain", Free)
    jobs.register("tenant", Keyed, concurrency_limit=2)
    with Session(clean) as s, s.begin():
        with pytest.raises(InvalidOptionError):
            jobs.enqueue(s, Free(n=1), concurrency_key="x")
        job = jobs.enqueue(s, Keyed(customer=1, seq=1), concurrency_key="tenant:1")
        assert (job.concurrency_key, job.concurrency_limit) == ("tenant:1", 2)
        with pytest.raises(InvalidOptionError):
            jobs.enqueue(s, Keyed(customer=1, seq=1), concurrency_key="")


def test_invalid_concurrency_options_are_refused_at_registration() -> None:
    with pytest.raises(RegistryError):
        Jobs().register("a", Free, concurrency_limit=0)
    with pytest.raises(RegistryError):
        Jobs().register("b", Free, concurrency_key="not callable")


def test_testing_run_jobs_runs_keyed_jobs_one_per_key(clean: Engine) -> None:
    jobs, runs = _recording_jobs(limit=1)
    with Session(clean) as s, s.begin():
        jobs.enqueue_many(s, [Keyed(customer=i % 2, seq=i // 2) for i in range(4)])
        # One per key per round: the key's next job waits for the first to finish.
        assert testing.run_jobs(jobs, s).done == 2
        assert testing.run_jobs(jobs, s).done == 2
        assert testing.run_jobs(jobs, s).done == 0
    assert {k: [seq for _, _, seq in v] for k, v in runs.items()} == {"c0": [0, 1], "c1": [0, 1]}
