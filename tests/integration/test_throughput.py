"""The per-minute throughput the workers write into ``sqla_jobs_throughput`` (the dashboard's
chart), read back with :func:`sqla_jobs.throughput.recent`, on a real PostgreSQL: outcomes by
kind and queue, run times and pickup delays, crashes, several workers adding to one minute, the
last counts written at a graceful stop, a worker with it off, a table it may not write, and the
pruner deleting old minutes."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, Retention, Worker
from sqla_jobs.observe.tally import Tally
from sqla_jobs.observe.throughput import Minute, recent
from sqla_jobs.worker.pruner import THROUGHPUT, Pruner
from tests._waiting import DEADLINE
from tests.integration._workers import running_workers, wait_until
from tests.integration.test_metrics import (
    Failing,
    Poison,
    Sleepy,
    Task,
    enqueue,
    make_jobs,
    states,
)

OUTCOMES = ("completed", "failed", "dead", "cancelled", "snoozed", "crashed")


@pytest.fixture
def empty(clean: Engine) -> Engine:
    """The engine, with no throughput rows and no paused queue."""
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_throughput, sqla_jobs_worker, sqla_jobs_queue"))
    return clean


def fast(**options: object) -> dict[str, object]:
    return {
        "concurrency": 8,
        "poll_interval": 0.1,
        "lease": 3.0,
        "reap_interval": 0.2,
        "queues": ["m1", "m2"],
        **options,
    }


def read(engine: Engine, jobs: Jobs, **options: object) -> list[Minute]:
    with Session(engine) as session:
        return recent(session, jobs, **options)  # type: ignore[arg-type]


def totals(minutes: list[Minute]) -> Counter[tuple[str, str, str]]:
    out: Counter[tuple[str, str, str]] = Counter()
    for m in minutes:
        for outcome in OUTCOMES:
            if getattr(m, outcome):
                out[(m.kind, m.queue, outcome)] += getattr(m, outcome)
    return out


def test_a_worker_records_each_outcome_by_kind_and_queue_with_run_times_and_pickup_delays(
    empty: Engine, migrated_url: str
) -> None:
    jobs, _ = make_jobs()
    n = 3
    with running_workers(jobs, migrated_url, **fast()):
        enqueue(empty, jobs, [Task() for _ in range(n)])
        enqueue(empty, jobs, [Task() for _ in range(n + 1)], queue="m2")
        enqueue(empty, jobs, [Failing() for _ in range(n)])
        ids = enqueue(empty, jobs, [Poison() for _ in range(n)])
        enqueue(empty, jobs, [Sleepy() for _ in range(n)])
        expected = {
            ("task", "m1", "completed"): n,
            ("task", "m2", "completed"): n + 1,
            ("failing", "m2", "failed"): n,
            ("poison", "m2", "dead"): n,
            ("sleepy", "m1", "snoozed"): n,
        }
        # Written at the reaper's beat, while the worker runs: not only at its stop.
        wait_until(lambda: totals(read(empty, jobs)) == expected, what="the counts are written")
        assert states(empty, ids) == ["dead"] * n
    minutes = read(empty, jobs)
    assert totals(minutes) == expected
    runs = sum(m.runs for m in minutes)
    assert runs == sum(expected.values())
    assert sum(m.pickups for m in minutes) == runs
    for m in minutes:
        assert m.minute.tzinfo is not None
        assert m.minute.second == 0
        assert m.run_seconds >= 0
        assert m.pickup_seconds >= 0
        assert m.mean_pickup_seconds is not None
        assert m.mean_pickup_seconds < 10
    assert [m.queue for m in read(empty, jobs, queue="m2")] == ["m2"] * 3


def test_the_reaper_records_a_crash(empty: Engine, migrated_url: str) -> None:
    jobs, _ = make_jobs()
    (crashed,) = enqueue(empty, jobs, [Task()], delay=3600)
    with empty.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'running', attempts = 1, "
                "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second', "
                "locked_by = 'vanished' WHERE id = :id"
            ),
            {"id": crashed},
        )
    with running_workers(jobs, migrated_url, **fast()):
        wait_until(lambda: states(empty, [crashed]) == ["gone"], what="the rescued job ran")
    assert totals(read(empty, jobs)) == {
        ("task", "m1", "crashed"): 1,
        ("task", "m1", "completed"): 1,
    }


def test_two_workers_add_their_counts_to_the_same_minute_row(
    empty: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    started_by: set[str] = set()
    both = threading.Event()

    @jobs.kind("task", Task, queue="m1")
    def task(args: Task, ctx: JobContext) -> None:
        # Neither worker's jobs finish until the other has started one: a worker that claimed
        # first could otherwise drain the queue alone on a loaded machine.
        started_by.add(ctx.worker)
        if len(started_by) == 2:
            both.set()
        assert both.wait(DEADLINE), "the other worker never started a job"

    n = 200
    # No prefetch: a worker claims no more than its 8 slots, and leaves the rest to the other.
    with running_workers(jobs, migrated_url, count=2, **fast(prefetch=0)) as workers:
        enqueue(empty, jobs, [Task() for _ in range(n)])
        wait_until(lambda: _done(workers) == n, what="drained")
    minutes = read(empty, jobs)
    assert totals(minutes) == {("task", "m1", "completed"): n}
    # One row per minute, queue and kind, whichever worker wrote first.
    keys = [(m.minute, m.queue, m.kind) for m in minutes]
    assert len(keys) == len(set(keys))
    assert all(w.counts["done"] > 0 for w in workers), "both workers ran jobs"


def _done(workers: list[Worker]) -> int:
    return sum(w.counts["done"] for w in workers)


def test_the_last_counts_are_written_when_the_worker_stops(
    empty: Engine, migrated_url: str
) -> None:
    jobs, _ = make_jobs()
    # A reap interval longer than the test: only the stop can write the counts.
    with running_workers(jobs, migrated_url, **fast(reap_interval=600.0)) as (worker,):
        # Its first pass runs at start: after it, the next is the stop's.
        wait_until(lambda: worker.reaper is not None and worker.reaper.passes >= 1)
        enqueue(empty, jobs, [Task() for _ in range(5)])
        wait_until(lambda: worker.counts["done"] == 5, what="five jobs done")
        assert read(empty, jobs) == []
    assert totals(read(empty, jobs)) == {("task", "m1", "completed"): 5}


def test_a_worker_with_throughput_off_writes_nothing_and_claims_without_due_times(
    empty: Engine, migrated_url: str
) -> None:
    jobs, _ = make_jobs()
    with running_workers(jobs, migrated_url, **fast(throughput=False)) as (worker,):
        assert worker.monitor.tally is None
        assert not worker.holdings.timed
        enqueue(empty, jobs, [Task() for _ in range(3)])
        wait_until(lambda: worker.counts["done"] == 3, what="three jobs done")
    assert read(empty, jobs) == []


def test_a_table_the_worker_may_not_write_is_logged_once_and_the_worker_carries_on(
    empty: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs, _ = make_jobs()
    with empty.begin() as conn:
        conn.execute(text("ALTER TABLE sqla_jobs_throughput RENAME TO sqla_jobs_throughput_away"))
    try:
        with (
            caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"),
            running_workers(jobs, migrated_url, **fast()) as (worker,),
        ):
            tally = worker.monitor.tally
            assert tally is not None
            enqueue(empty, jobs, [Task() for _ in range(3)])
            wait_until(lambda: not tally.enabled, what="the tally gave up")
            enqueue(empty, jobs, [Task() for _ in range(3)])
            wait_until(lambda: worker.counts["done"] == 6, what="the worker carries on")
    finally:
        with empty.begin() as conn:
            conn.execute(
                text("ALTER TABLE sqla_jobs_throughput_away RENAME TO sqla_jobs_throughput")
            )
    refused = [r for r in caplog.records if getattr(r, "event", None) == "throughput_refused"]
    assert len(refused) == 1
    assert "sqla_jobs_0007" in refused[0].getMessage()


def test_a_flush_that_loses_its_connection_keeps_the_counts_for_the_next_one(
    empty: Engine, migrated_url: str
) -> None:
    import psycopg

    from sqla_jobs.db.urls import libpq_conninfo

    tally = Tally(schema=None, name="t")
    tally.reaped("task", "m1")
    conn = psycopg.connect(libpq_conninfo(migrated_url), autocommit=True)
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        tally.flush(conn)
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as live:
        tally.flush(live)
    jobs = Jobs()
    assert totals(read(empty, jobs)) == {("task", "m1", "crashed"): 1}


def test_the_pruner_deletes_minutes_older_than_the_retention_and_keeps_the_rest(
    empty: Engine, migrated_url: str
) -> None:
    with empty.begin() as conn:
        for age in ("3 days", "25 hours", "23 hours", "0 minutes"):
            conn.execute(
                text(
                    "INSERT INTO sqla_jobs_throughput (minute, queue, kind, completed) "
                    "VALUES (date_trunc('minute', now() - CAST(:age AS interval)), 'q', 'k', 1)"
                ),
                {"age": age},
            )
    from sqla_jobs.db.connections import Connector
    from sqla_jobs.db.urls import libpq_conninfo

    pruner = Pruner(
        connector=Connector(libpq_conninfo(migrated_url), "pruner-test", None),
        schema=None,
        retention=Retention(throughput=timedelta(hours=24)),
        interval=300,
    )
    try:
        counts = pruner.prune_once()
    finally:
        pruner._close()
    assert counts is not None
    assert counts[THROUGHPUT] == 2
    left = read(empty, Jobs(), minutes=7 * 24 * 60)
    assert [m.completed for m in left] == [1, 1]
    assert recent_is_bounded(empty)


def recent_is_bounded(engine: Engine) -> bool:
    with pytest.raises(ValueError, match="minutes must be 1 to"):
        read(engine, Jobs(), minutes=0)
    with pytest.raises(ValueError, match="invalid queue name"):
        read(engine, Jobs(), queue="no spaces")
    return True
