"""What a kind with ``results=True`` may store: JSON (pydantic models dumped in JSON mode), no
NaN, at most ``MAX_RESULT_BYTES``; anything else is a ``ResultError`` that names the job."""

from __future__ import annotations

import json
from datetime import date

import pytest
from pydantic import BaseModel

from sqla_jobs import Jobs, RegistryError, ResultError
from sqla_jobs._outcome import completed, encode_result
from sqla_jobs.kinds import MAX_RESULT_BYTES
from tests.unit._claimed import claimed_job


class Report(BaseModel):
    day: date
    rows: int


def test_json_values_and_pydantic_models_encode_as_json() -> None:
    assert json.loads(encode_result(1, "k", {"a": [1, "b", None, True]})) == {
        "a": [1, "b", None, True]
    }
    assert json.loads(encode_result(1, "k", None)) is None
    assert json.loads(encode_result(1, "k", Report(day=date(2026, 1, 2), rows=3))) == {
        "day": "2026-01-02",
        "rows": 3,
    }
    assert json.loads(encode_result(1, "k", [Report(day=date(2026, 1, 2), rows=1)])) == [
        {"day": "2026-01-02", "rows": 1}
    ]


@pytest.mark.parametrize("value", [{1, 2}, object(), float("nan"), {"d": date(2026, 1, 1)}])
def test_a_value_that_is_not_json_is_a_result_error_naming_the_job(value: object) -> None:
    with pytest.raises(ResultError, match=r"job 7 \(kind_a\): the handler succeeded"):
        encode_result(7, "kind_a", value)


def test_the_cap_is_on_the_bytes_of_json() -> None:
    at_cap = "x" * (MAX_RESULT_BYTES - 2)  # the two quotes make the cap exactly
    assert len(encode_result(1, "k", at_cap)) == MAX_RESULT_BYTES
    with pytest.raises(ResultError, match=f"{MAX_RESULT_BYTES + 1} bytes"):
        encode_result(1, "k", at_cap + "x")
    with pytest.raises(ResultError, match="bytes of JSON"):
        encode_result(1, "k", "é" * (MAX_RESULT_BYTES // 2))  # two bytes each in UTF-8


def test_results_is_off_by_default_and_must_be_a_bool() -> None:
    jobs = Jobs()
    assert jobs.register("plain", Report).options.results is False
    assert jobs.register("stored", type("R2", (Report,), {}), results=True).options.results
    with pytest.raises(RegistryError, match="results must be True or False"):
        jobs.register("bad", type("R3", (Report,), {}), results="yes")  # type: ignore[arg-type]


def test_a_completion_carries_its_result_and_none_by_default() -> None:
    assert completed(claimed_job(1)).result is None
    assert completed(claimed_job(1), result="[1]").result == "[1]"
