"""The outcome rules, shared by the worker and testing.run_jobs, without a database."""

from __future__ import annotations

from pydantic import BaseModel

from sqla_jobs import Backoff, Jobs
from sqla_jobs._outcome import HandlerTimeout, Outcome, describe, failed, resolve
from sqla_jobs.context import ClaimedJob

from ._claimed import claimed_job


class Order(BaseModel):
    order_id: int


class Report(BaseModel):
    report_id: int


JOBS = Jobs()
JOBS.register("order", Order, lambda args, ctx: None, backoff=Backoff(base=3))
JOBS.register("enqueue_only", Report)


def job(kind: str, payload: str) -> ClaimedJob:
    return claimed_job(kind=kind, payload=payload)


def test_a_valid_job_resolves_to_its_kind_and_decoded_payload() -> None:
    resolved = resolve(JOBS, job("order", '{"order_id": 7}'))
    assert not isinstance(resolved, Outcome)
    kind, args = resolved
    assert (kind.name, args) == ("order", Order(order_id=7))


def test_an_unknown_kind_or_one_without_handler_is_a_failure_with_the_default_backoff() -> None:
    for name in ("from_a_newer_deploy", "enqueue_only"):
        outcome = resolve(JOBS, job(name, "{}"))
        assert isinstance(outcome, Outcome)
        assert not outcome.dead
        assert outcome.backoff == Backoff()
        assert outcome.error is not None
        assert outcome.error.startswith(f"unknown kind {name!r}")


def test_a_payload_that_no_longer_validates_is_dead_and_names_the_field_not_the_value() -> None:
    outcome = resolve(JOBS, job("order", '{"order_id": "secret-value"}'))
    assert isinstance(outcome, Outcome)
    assert outcome.dead
    assert outcome.error is not None
    assert "order_id" in outcome.error
    assert "secret-value" not in outcome.error


def test_a_handler_exception_fails_with_the_kinds_backoff_and_where_it_was_raised() -> None:
    kind = JOBS.kind_named("order")
    assert kind is not None
    try:
        raise ValueError("no such order")
    except ValueError as exc:
        outcome = failed(job("order", "{}"), kind, exc)
    assert outcome.backoff == Backoff(base=3)
    assert outcome.error is not None
    assert outcome.error.startswith("ValueError: no such order (at ")
    assert not outcome.dead
    timeout = failed(job("order", "{}"), kind, HandlerTimeout("timed out after 2s"))
    assert timeout.error == "timed out after 2s"


def test_describe_truncates_a_message_storm_but_keeps_where_it_was_raised() -> None:
    try:
        raise RuntimeError("x" * 10_000)
    except RuntimeError as exc:
        text = describe(exc)
    assert len(text) <= 500
    assert text.endswith(f"test_outcome.py:{text.rsplit(':', 1)[1]}")
    assert "(at " in text
