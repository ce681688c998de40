"""Transaction edges: jobs enqueued in the caller's transactions from many threads, half rolled back
(whole or a savepoint), some held open while workers poll every 50 ms. A job runs if and only if
its transaction committed, and never before the commit."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from sqla_jobs.db.urls import sqlalchemy_url
from tests.integration._workers import wait_until
from tests.reliability.chaos_app import (
    Fleet,
    Fulfil,
    jobs,
    queue_length,
    reset_tables,
    runs_by_job,
    scalar,
)
from tests.reliability.conftest import Figures, injects, scaled

THREADS = 6
PER_THREAD = scaled(40, 200)
WORKERS = 2
OPTIONS = ("--concurrency", "4", "--poll-interval", "0.05")
#: Fates of an enqueuing transaction, with their odds.
FATES = {"commit": 4, "rollback": 4, "savepoint_rollback": 1, "held_open": 1}


def claimed_since(fleet: Fleet, engine: Engine, since: datetime) -> Callable[[], bool]:
    """A condition: every worker polled (ran a claim, or the probe a drained worker's poll runs
    first to find the queues with something to claim) after ``since`` (database clock)."""

    def check() -> bool:
        with engine.connect() as conn:
            seen = conn.execute(
                text(
                    "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                    "WHERE datname = current_database() "
                    "AND application_name LIKE 'sqla-jobs claim %' "
                    "AND (query LIKE 'WITH claimed AS%' OR query LIKE 'SELECT wanted.queue%') "
                    "AND query_start > :since"
                ),
                {"since": since},
            ).scalar()
        return seen == len(fleet.workers)

    return check


@injects(
    f"{THREADS} threads enqueueing in their own transactions: 40% roll back, 10% roll back a "
    "savepoint, 10% stay open until every worker has polled past them"
)
def test_jobs_run_exactly_when_their_transaction_commits_and_never_before(
    clean: Engine, migrated_url: str, figures: Figures, tmp_path: Path
) -> None:
    """Enqueue in caller transactions, half rolled back, some held open: a job runs iff committed"""
    reset_tables(clean)
    writers = create_engine(sqlalchemy_url(migrated_url), pool_size=THREADS)
    fleet = Fleet(migrated_url, tmp_path, OPTIONS)
    outcomes: dict[str, set[int]] = {fate: set() for fate in FATES}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def write(seed: int) -> None:
        rng = random.Random(seed)
        fates = rng.choices(list(FATES), weights=list(FATES.values()), k=PER_THREAD)
        try:
            for fate in fates:
                with Session(writers) as session, session.begin():
                    order = session.execute(
                        text("INSERT INTO chaos_orders (note) VALUES (:fate) RETURNING id"),
                        {"fate": fate},
                    ).scalar_one()
                    if fate == "savepoint_rollback":
                        # The order commits; the job, enqueued inside a savepoint, does not.
                        savepoint = session.begin_nested()
                        job_id = jobs.enqueue(session, Fulfil(order_id=order)).id
                        savepoint.rollback()
                    else:
                        job_id = jobs.enqueue(session, Fulfil(order_id=order)).id
                    if fate == "held_open":
                        # Hold the transaction, job and order written but uncommitted, until
                        # every worker has polled at least once since (the database clock).
                        since = session.execute(text("SELECT clock_timestamp()")).scalar_one()
                        wait_until(
                            claimed_since(fleet, clean, since), timeout=30, what="workers polled"
                        )
                    if fate == "rollback":
                        session.rollback()
                with lock:
                    outcomes[fate].add(job_id)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    try:
        for _ in range(WORKERS):
            fleet.wait_started(fleet.spawn())
        started = time.monotonic()
        threads = [threading.Thread(target=write, args=(seed,)) for seed in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], errors
        assert not any(t.is_alive() for t in threads), "an enqueuing thread is stuck"
        wait_until(lambda: queue_length(clean) == 0, timeout=60, what="every committed job done")
        elapsed = time.monotonic() - started
        codes = fleet.stop()
    finally:
        fleet.close()
        writers.dispose()
    assert set(codes.values()) == {0}, codes

    committed = outcomes["commit"] | outcomes["held_open"]
    runs = runs_by_job(clean)
    assert set(runs) == committed, "the jobs that ran are not exactly the committed ones"
    assert Counter(runs.values()) == Counter({1: len(committed)}), "a job ran more than once"
    violations = scalar(clean, "SELECT count(*) FROM chaos_violations")
    assert violations == 0, "a job ran before the transaction that enqueued it committed"
    orders = scalar(clean, "SELECT count(*) FROM chaos_orders")
    assert orders == len(committed) + len(outcomes["savepoint_rollback"])
    assert outcomes["held_open"], "no transaction was held open: the scenario proved nothing"
    figures.record(
        transactions=THREADS * PER_THREAD,
        committed=len(committed),
        rolled_back=len(outcomes["rollback"]),
        savepoint_rolled_back=len(outcomes["savepoint_rollback"]),
        held_open=len(outcomes["held_open"]),
        ran=sum(runs.values()),
        ran_uncommitted=0,
        ran_before_commit=violations,
        seconds=round(elapsed, 1),
    )
