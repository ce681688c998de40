"""Retention settings and the durations they are written in."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sqla_jobs import Retention
from sqla_jobs.retention import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("90m", timedelta(minutes=90)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        ("1.5h", timedelta(minutes=90)),
        (" 0s ", timedelta(0)),
        ("7D", timedelta(days=7)),
    ],
)
def test_parse_duration_reads_a_number_and_a_unit(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "-1d", "1 d", "1h30m", "7days", "1y", "forever"])
def test_parse_duration_refuses_anything_else_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected a number and a unit, s, m, h, d or w"):
        parse_duration(text)


@pytest.mark.parametrize("keep", [timedelta(hours=24), timedelta(days=7), timedelta(seconds=90)])
def test_format_duration_round_trips(keep: timedelta) -> None:
    assert parse_duration(format_duration(keep)) == keep


def test_the_default_retention_is_a_day_for_completed_and_cancelled_a_week_for_dead() -> None:
    assert Retention().by_state() == {
        "completed": timedelta(hours=24),
        "dead": timedelta(days=7),
        "cancelled": timedelta(hours=24),
    }
    assert Retention().throughput == timedelta(hours=24)
    assert Retention().prunes
    # The per-minute throughput counts alone still need a pruner.
    assert Retention(completed=None, dead=None, cancelled=None).prunes
    assert not Retention(completed=None, dead=None, cancelled=None, throughput=None).prunes


@pytest.mark.parametrize("field", ["dead", "throughput"])
def test_a_negative_retention_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=rf"Retention\.{field}"):
        Retention(**{field: timedelta(seconds=-1)})  # type: ignore[arg-type]


def test_format_duration_writes_the_defaults_as_the_readme_does() -> None:
    assert [format_duration(k) for k in Retention().by_state().values()] == ["24h", "7d", "24h"]
    assert format_duration(None) == "forever"
