"""``JobContext.for_job`` builds the instance's dict itself (the worker builds one per job): it
must hold every field, and equal the context the dataclass's constructor builds."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timedelta, timezone

import pytest

from sqla_jobs import JobContext
from sqla_jobs.context import ClaimedJob, ClaimedWithDue, ClaimedWithMeta, due_at, row_maker

from ._claimed import claimed_job


def constructed(job: ClaimedJob, steps: dict[str, object]) -> JobContext:
    return JobContext(
        job_id=job.id,
        kind=job.kind,
        queue=job.queue,
        attempt=job.attempts,
        crashes=job.crashes,
        max_attempts=job.max_attempts,
        created_at=datetime(1970, 1, 1, tzinfo=timezone.utc)
        + timedelta(microseconds=job.created_us),
        worker="w1",
        steps=steps,
        lease_token=job.lease_token,
        recorder=None,
        interruptions=job.interruptions,
    )


def test_for_job_sets_every_field_and_nothing_else() -> None:
    ctx = JobContext.for_job(claimed_job(7), "w1", None)
    fields = {f.name for f in dataclasses.fields(JobContext)}
    # created_at is built on first read, from the claim's microseconds.
    assert set(vars(ctx)) == fields - {"created_at"} | {"_created_us"}
    assert ctx.created_at == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert ctx.created_at is ctx.created_at
    assert set(vars(ctx)) == fields | {"_created_us"}
    with pytest.raises(AttributeError, match="no attribute 'atempt'"):
        ctx.atempt  # type: ignore[attr-defined]  # noqa: B018


def test_created_at_keeps_every_microsecond() -> None:
    for when in (
        datetime(2026, 12, 6, 11, 15, 41, 984604, tzinfo=timezone.utc),
        datetime(2099, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc),
        datetime(1999, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc),
    ):
        us = (when - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)
        job = claimed_job(7)._replace(created_us=us)
        assert JobContext.for_job(job, "w1", None).created_at == when


@pytest.mark.parametrize(
    ("stored", "steps"),
    [
        (None, {}),
        ("{}", {}),
        ('{"a": [1, 2]}', {"a": [1, 2]}),
        ({"b": 1}, {"b": 1}),
        ("null", {}),
    ],
)
def test_for_job_equals_the_constructed_context(stored: object, steps: dict[str, object]) -> None:
    job = claimed_job(7)._replace(steps=stored)
    ctx = JobContext.for_job(job, "w1", None)
    assert ctx == constructed(job, steps)
    assert ctx.lease_lost is ctx.lease_lost
    assert not ctx.cancelled.is_set()
    assert not ctx.in_session
    assert ctx.deadline is None
    timed = JobContext.for_job(job, "w1", None, timeout=5.0)
    assert timed.deadline is not None
    assert 0 < timed.deadline - time.monotonic() <= 5.0


def test_the_steps_dict_is_the_contexts_own() -> None:
    stored = {"b": 1}
    ctx = JobContext.for_job(claimed_job(7)._replace(steps=stored), "w1", None)
    ctx.steps["c"] = 2
    assert stored == {"b": 1}


def test_a_claimed_row_with_due_at_gives_it_in_seconds_of_the_monotonic_clock() -> None:
    # The claim returns due_at as integer microseconds, last (after the meta, when asked).
    timed = row_maker(meta=False, timed=True)((*claimed_job(7), 12_345_678))
    assert isinstance(timed, ClaimedWithDue)
    assert due_at(timed) == pytest.approx(12.345678)
    both = row_maker(meta=True, timed=True)((*claimed_job(7), '{"a": 1}', 5_000_000))
    assert isinstance(both, ClaimedWithMeta)
    assert (both.meta, due_at(both)) == ('{"a": 1}', 5.0)
    job = claimed_job(7)
    plain = row_maker(meta=False, timed=False)(tuple(job))
    assert (type(plain), plain) == (ClaimedJob, job)
