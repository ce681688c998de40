"""``RateLimit`` refuses what cannot work with a message naming it, and enqueue computes each job's
limiter key (the kind, and ``by=``'s key after a space) the same way one job at a time and in a
batch."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from sqla_jobs import InvalidOptionError, InvalidPayloadError, Jobs, RateLimit, RegistryError
from sqla_jobs.enqueue.validate import prepare
from sqla_jobs.enqueue.validate_many import prepare_many
from sqla_jobs.rate_limit import rate_key

SECOND = timedelta(seconds=1)


class Call(BaseModel):
    account: str
    n: int = 0


class Plain(BaseModel):
    n: int


@pytest.mark.parametrize(
    ("limit", "per", "message"),
    [
        (0, SECOND, "limit must be in [1, 10000], got 0"),
        (-3, SECOND, "limit must be in [1, 10000], got -3"),
        (True, SECOND, "limit must be an int >= 1, got True"),
        (2.5, SECOND, "limit must be an int >= 1, got 2.5"),
        (1, timedelta(0), "per must be a positive duration, got 0:00:00"),
        (1, -SECOND, "per must be a positive duration"),
        (1, timedelta(microseconds=10), "per must be at least 1 millisecond"),
        (1, 5, "per must be a timedelta, got int"),
    ],
)
def test_a_rate_limit_that_cannot_work_is_refused_with_what_is_wrong(
    limit: Any, per: Any, message: str
) -> None:
    with pytest.raises(RegistryError, match=message.replace("[", r"\[").replace("]", r"\]")):
        RateLimit(limit, per=per)


def test_by_must_be_a_function() -> None:
    with pytest.raises(RegistryError, match="by must be a function of the payload"):
        RateLimit(1, per=SECOND, by="account")  # type: ignore[arg-type]


def test_a_kind_takes_only_a_rate_limit_object() -> None:
    jobs = Jobs()
    with pytest.raises(RegistryError, match="rate_limit must be a RateLimit"):
        jobs.register("call", Call, rate_limit=5)  # type: ignore[arg-type]


def test_the_limiter_key_is_the_kind_then_the_by_key() -> None:
    per_account = RateLimit(2, per=SECOND, by=lambda p: p.account)
    assert rate_key("call", None, Call(account="a")) is None
    assert rate_key("call", RateLimit(2, per=SECOND), Call(account="a")) == "call"
    assert rate_key("call", per_account, Call(account="acme")) == "call acme"


@pytest.mark.parametrize(
    ("by", "error", "message"),
    [
        (lambda p: "", InvalidOptionError, "must be a str of 1-256 characters"),
        (lambda p: 7, InvalidOptionError, "must be a str of 1-256 characters"),
        (lambda p: "a\x00b", InvalidOptionError, "without NUL"),
        (lambda p: p.missing, InvalidPayloadError, "rate limit key .by=. of kind 'call' failed"),
    ],
)
def test_a_by_key_that_cannot_be_used_refuses_the_enqueue(
    by: Any, error: type[Exception], message: str
) -> None:
    jobs = Jobs()
    jobs.register("call", Call, rate_limit=RateLimit(1, per=SECOND, by=by))
    with pytest.raises(error, match=message):
        prepare(
            jobs,
            Call(account="a"),
            None,
            max_bytes=10_000,
            queue=None,
            priority=None,
            max_attempts=None,
        )


def test_a_batch_gets_each_jobs_limiter_key_as_one_by_one_enqueues_do() -> None:
    jobs = Jobs()
    jobs.register("call", Call, rate_limit=RateLimit(2, per=SECOND, by=lambda p: p.account))
    jobs.register("plain", Plain, rate_limit=RateLimit(2, per=SECOND))
    payloads: list[BaseModel] = [Call(account="a"), Call(account="b"), Plain(n=1), Plain(n=2)]
    batch = prepare_many(
        jobs, payloads, max_bytes=10_000, queue=None, priority=None, max_attempts=None
    )
    assert batch.column("rate_key") == ["call a", "call b", "plain", "plain"]
