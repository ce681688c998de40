"""``prepare_many`` takes runs of one model through a fast loop: it must write exactly what the
payload-by-payload path writes, and refuse exactly what it refuses, at the same position."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from sqla_jobs import Jobs
from sqla_jobs.enqueue.validate import Batch, prepare
from sqla_jobs.enqueue.validate_many import prepare_many
from sqla_jobs.errors import (
    InvalidPayloadError,
    InvalidTextError,
    PayloadTooLargeError,
    UnknownKindError,
)


class Ping(BaseModel):
    n: int
    tag: str = "x"


class Mail(BaseModel):
    to: str


class Keyed(BaseModel):
    account: str


class Stray(BaseModel):
    n: int


def _jobs() -> Jobs:
    jobs = Jobs()
    jobs.register("ping", Ping)
    jobs.register("mail", Mail, queue="mail", priority=3)
    jobs.register("keyed", Keyed, concurrency_limit=1, concurrency_key=lambda k: k.account)
    return jobs


def _many(jobs: Jobs, payloads: list[Any], **options: Any) -> Batch:
    return prepare_many(
        jobs,
        payloads,
        max_bytes=options.pop("max_bytes", jobs.max_payload_bytes),
        queue=options.pop("queue", None),
        priority=options.pop("priority", None),
        max_attempts=options.pop("max_attempts", None),
    )


def _one_by_one(jobs: Jobs, payloads: list[BaseModel]) -> Batch:
    """What the batch must equal: :func:`prepare` of each payload, as columns."""
    batch = Batch()
    for payload in payloads:
        job = prepare(
            jobs,
            payload,
            None,
            max_bytes=jobs.max_payload_bytes,
            queue=None,
            priority=None,
            max_attempts=None,
        )
        batch.add(job)
    return batch


def test_runs_of_models_give_the_columns_one_by_one_preparation_gives() -> None:
    jobs = _jobs()
    payloads: list[BaseModel] = [
        Ping(n=1),
        Ping(n=2, tag='quo"te \\ \u00e9'),
        Mail(to="a@example.com"),
        Keyed(account="acme"),
        Keyed(account="beta"),
        Ping(n=3),
    ]
    assert _many(jobs, payloads) == _one_by_one(jobs, payloads)


def test_a_generator_of_payloads_is_taken_like_a_list() -> None:
    jobs = _jobs()
    payloads = [Ping(n=i) for i in range(5)]
    assert _many(jobs, (p for p in payloads)) == _many(jobs, payloads)  # type: ignore[arg-type]


def _mutated(n: Any) -> Ping:
    ping = Ping(n=1)
    ping.n = n
    return ping


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (_mutated("seven"), InvalidPayloadError, "cannot be serialized"),
        (Ping.model_construct(), InvalidPayloadError, "does not validate"),
        (Ping(n=1, tag="nul \x00 inside"), InvalidPayloadError, "NUL"),
        (Ping(n=1, tag="p" * 70_000), PayloadTooLargeError, "over the limit"),
        (Stray(n=1), UnknownKindError, ""),
    ],
    ids=["mutated", "construct-missing-field", "nul", "too-large", "unregistered"],
)
def test_a_bad_payload_inside_a_run_is_refused_at_its_position(
    bad: BaseModel, error: type[Exception], match: str
) -> None:
    jobs = _jobs()
    payloads = [Ping(n=0), Ping(n=1), Mail(to="x"), Ping(n=3), Ping(n=4), bad, Ping(n=6)]
    with pytest.raises(error, match=rf"^payload 5: .*{match}"):
        _many(jobs, payloads)


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    # The JSON text holds \\u0000 (a backslash, then "u0000"): the fast loop hands it to the
    # exact check, which accepts it.
    jobs = _jobs()
    payloads = [Ping(n=1, tag="\\u0000"), Ping(n=2)]
    assert _many(jobs, payloads) == _one_by_one(jobs, payloads)


class Tagged(BaseModel):
    tags: dict[str, str]


def test_a_payload_holding_the_replacement_character_is_stored_as_given() -> None:
    """U+FFFD is what pydantic's dump writes for a dict key it cannot encode; one that was in the
    payload all along is data, on the run loop and one by one."""
    jobs = _jobs()
    jobs.register("tagged", Tagged)
    payloads: list[BaseModel] = [Tagged(tags={"\ufffd": "\ufffd"})] * 2
    assert _many(jobs, payloads).column("payload") == ['{"tags":{"\ufffd":"\ufffd"}}'] * 2


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        (Tagged(tags={"tenant-\ud800": "v"}), "a key of field tags"),
        (Tagged(tags={"k": "tenant-\udfff"}), "field tags.k"),
    ],
    ids=["key", "value"],
)
def test_a_lone_surrogate_in_a_payload_is_refused_naming_where_it_is(
    payload: BaseModel, where: str
) -> None:
    jobs = _jobs()
    jobs.register("tagged", Tagged)
    with pytest.raises(InvalidTextError, match=f"payload 1: payload for kind 'tagged': {where} "):
        _many(jobs, [Tagged(tags={}), payload])
    with pytest.raises(InvalidTextError) as caught:
        prepare(jobs, payload, None, max_bytes=1000, queue=None, priority=None, max_attempts=None)
    assert caught.value.field == where


class Escaped(BaseModel):
    account: str


def test_a_lone_surrogate_in_a_concurrency_key_is_refused_given_or_computed() -> None:
    jobs = _jobs()
    # The key function decodes the account as JSON would: the payload itself is plain ASCII.
    jobs.register(
        "escaped", Escaped, concurrency_limit=1, concurrency_key=lambda e: json.loads(e.account)
    )
    with pytest.raises(InvalidTextError, match="concurrency key for kind 'escaped'") as caught:
        _many(jobs, [Escaped(account='"tenant-\\ud800"')])
    assert caught.value.field == "concurrency_key"
    with pytest.raises(InvalidTextError, match="concurrency key for kind 'keyed'"):
        prepare(
            jobs,
            Keyed(account="a"),
            None,
            max_bytes=1000,
            queue=None,
            priority=None,
            max_attempts=None,
            concurrency_key="\udc80",
        )
