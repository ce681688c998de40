"""Backoff policies are pure functions: property tests, no database."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqla_jobs import Backoff, ConfigurationError


def test_default_schedule_doubles_from_two_seconds_and_caps_at_an_hour() -> None:
    b = Backoff()
    assert [b.delay(n) for n in range(1, 6)] == [2, 4, 8, 16, 32]
    assert b.delay(11) == 2048
    assert b.delay(12) == 3600
    assert b.delay(10_000) == 3600


@given(st.integers(min_value=0, max_value=5000), st.floats(min_value=1, max_value=10))
def test_delay_is_monotonic_and_never_exceeds_the_cap(n: int, base: float) -> None:
    b = Backoff(base=base, cap_seconds=600)
    assert 0 <= b.delay(n) <= 600
    assert b.delay(n) <= b.delay(n + 1)


@given(st.integers(min_value=0, max_value=60), st.floats(min_value=0, max_value=1))
def test_jitter_bounds_stretch_the_delay_upwards_only(n: int, jitter: float) -> None:
    lo, hi = Backoff(jitter=jitter).bounds(n)
    assert lo == Backoff().delay(n)
    assert lo <= hi <= lo * 2


@pytest.mark.parametrize(
    "kwargs", [{"base": 0.5}, {"cap_seconds": -1}, {"jitter": 1.5}, {"jitter": -0.1}]
)
def test_impossible_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Backoff(**kwargs)
