"""What a worker holds, without a database: the crash rule, a job claimed twice, lost leases."""

from __future__ import annotations

import uuid
from typing import Any

from sqla_jobs._outcome import Outcome
from sqla_jobs.context import ClaimedJob, JobContext
from sqla_jobs.worker.holdings import Holdings

from ._claimed import claimed_job


def row(
    job_id: int, *, crashes: int = 0, max_crashes: int = 3, token: uuid.UUID | None = None
) -> tuple[Any, ...]:
    """A claimed row, in the claim's column order."""
    return tuple(claimed_job(job_id, crashes=crashes, max_crashes=max_crashes, token=token))


def start_next(holdings: Holdings) -> tuple[ClaimedJob, JobContext]:
    """What a slot does: take the next buffered job, deferring one whose id runs already."""
    while True:
        job = holdings.buffer.popleft()
        if job.id not in holdings.running:
            break
        holdings.defer(job)
    ctx = JobContext.for_job(job, "w", None)
    holdings.running[job.id] = (job, ctx, None)
    return job, ctx


def test_crashed_jobs_not_on_their_last_life_are_held_together() -> None:
    holdings = Holdings()
    taken = holdings.take([row(1, crashes=1), row(2, crashes=1), row(3)], now=0.0)
    assert taken == 3
    assert holdings.give_back == []
    assert holdings.crash_params() == {"crashed_ok": True, "last_life_ok": False}


def test_a_job_on_its_last_crash_life_is_never_held_with_another_crashed_job() -> None:
    holdings = Holdings()
    holdings.take([row(1, crashes=2), row(2, crashes=1), row(3, crashes=2), row(4)], now=0.0)
    assert [j.id for j in holdings.buffer] == [1, 4]
    assert sorted(j.id for j in holdings.give_back) == [2, 3]
    assert holdings.crash_params() == {"crashed_ok": False, "last_life_ok": False}


def test_the_crash_rule_frees_up_once_the_crashed_job_has_run() -> None:
    holdings = Holdings()
    holdings.take([row(1, crashes=2)], now=0.0)
    job, _ = start_next(holdings)
    holdings.end(job, Outcome(job), now=1.0)
    assert holdings.crash_params() == {"crashed_ok": True, "last_life_ok": True}
    assert [o.job.id for o in holdings.finished] == [1]


def test_a_job_claimed_again_while_an_older_run_of_it_runs_waits_for_that_run() -> None:
    holdings = Holdings()
    holdings.take([row(7)], now=0.0)
    old, _ = start_next(holdings)
    holdings.take([row(7, crashes=1)], now=1.0)  # reaped meanwhile, claimed again here
    assert list(holdings.buffer) == []
    assert [j.crashes for j in holdings.deferred] == [1]
    assert len(holdings.snapshot()) == 2, "both claims keep their leases"
    holdings.end(old, Outcome(old), now=2.0)
    assert [(j.id, j.crashes) for j in holdings.buffer] == [(7, 1)]
    assert holdings.deferred == []


def test_lost_leases_drop_jobs_not_started_and_tell_running_ones() -> None:
    holdings = Holdings()
    holdings.take([row(1), row(2), row(3)], now=0.0)
    job, ctx = start_next(holdings)
    lost = {(job.id, job.lease_token)}
    lost |= {(j.id, j.lease_token) for j in holdings.buffer if j.id == 2}
    buffer = holdings.buffer  # as a slot holds it
    holdings.lost(lost)
    assert ctx.lease_lost.is_set()
    assert [j.id for j in buffer] == [3], "the slots' deque itself lost the dropped job"


def test_a_buffered_job_whose_id_already_runs_here_is_deferred_when_its_turn_comes() -> None:
    holdings = Holdings()
    holdings.take([row(5), row(5), row(6)], now=0.0)  # claimed twice, its first lease since lost
    first, _ = start_next(holdings)
    second, _ = start_next(holdings)
    assert (first.id, second.id) == (5, 6)
    assert [j.id for j in holdings.deferred] == [5]


def test_the_room_counts_running_buffered_deferred_and_reserved_jobs() -> None:
    holdings = Holdings()
    holdings.take([row(1), row(2)], now=0.0)
    start_next(holdings)
    holdings.take([row(1)], now=0.0)  # deferred behind its own run
    holdings.reserved = 3
    assert holdings.room(concurrency=4, prefetch=4) == 8 - 3 - 3
