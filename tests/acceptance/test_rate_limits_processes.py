"""Rate limits kept by real worker processes: three ``sqla-jobs worker`` processes drain limited
kinds, and no window of ``per`` holds more starts than the limit, per kind and per key."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import wait_until
from tests.acceptance._processes import WorkerProcess
from tests.acceptance.rate_limits_app import PER, Call, Keyed, jobs
from tests.integration._rate_limits import busiest_window, claims, recorded_claims


def test_three_worker_processes_keep_each_limit_in_every_window(
    clean: Engine, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    with recorded_claims(clean):
        with Session(clean) as s, s.begin():
            jobs.enqueue_many(s, [Call(n=i) for i in range(9)])
            jobs.enqueue_many(s, [Keyed(n=i, key=f"k{i % 2}") for i in range(8)])
        target = "tests.acceptance.rate_limits_app:jobs"
        for _ in range(3):
            spawn_worker("--concurrency", "4", "--poll-interval", "30", target=target)

        def empty() -> bool:
            with clean.connect() as conn:
                return conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 0

        wait_until(empty, "every limited job to run")
        started = claims(clean)
    assert {key: len(times) for key, times in started.items()} == {
        "call": 9,
        "keyed_call k0": 4,
        "keyed_call k1": 4,
    }
    assert busiest_window(started["call"], PER) == 3
    assert busiest_window(started["keyed_call k0"], PER) == 2
    assert busiest_window(started["keyed_call k1"], PER) == 2
