"""The throughput page's pure parts: the last hour summed from the workers' minutes, and the
inline SVG drawn from it (valid XML, bars as tall as their counts, gaps where no run ended)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from sqla_jobs.dashboard import _chart, _series
from sqla_jobs.observe.throughput import Minute

SVG = "{http://www.w3.org/2000/svg}"
NOW = datetime(2026, 12, 1, 12, 30, 42, tzinfo=timezone.utc)


def minute(at: datetime, queue: str, kind: str, **counts: float) -> Minute:
    """A :class:`Minute` as ``recent`` returns them: every count 0 unless given."""
    zero = dict.fromkeys(
        ("completed", "failed", "dead", "cancelled", "snoozed", "crashed", "runs", "pickups"), 0
    )
    return Minute(
        minute=at,
        queue=queue,
        kind=kind,
        **{**zero, "run_seconds": 0.0, "pickup_seconds": 0.0, **counts},  # type: ignore[arg-type]
    )


def ago(minutes: int) -> datetime:
    return NOW.replace(second=0) - timedelta(minutes=minutes)


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [(0, 1), (0.3, 0.5), (1, 1), (7, 10), (12, 20), (24, 25), (26, 50), (101, 200), (4500, 5000)],
)
def test_the_scale_ends_on_a_round_number(value: float, ceiling: float) -> None:
    assert _chart.nice_ceiling(value) == pytest.approx(ceiling)


def test_the_hour_sums_kinds_per_minute_and_minutes_per_kind_and_means_are_sums_over_counts() -> (
    None
):
    minutes = [
        minute(
            ago(0),
            "mail",
            "send",
            completed=4,
            runs=4,
            run_seconds=2.0,
            pickups=4,
            pickup_seconds=1.0,
        ),
        minute(ago(0), "mail", "bounce", completed=1, dead=1, runs=2, run_seconds=4.0),
        minute(
            ago(5),
            "reports",
            "build",
            failed=2,
            runs=2,
            run_seconds=10.0,
            pickups=2,
            pickup_seconds=6.0,
        ),
        minute(ago(60), "mail", "send", completed=100),  # before the hour: left out
    ]
    hour = _series.hour(minutes, NOW)
    assert len(hour.slots) == _series.SPAN
    assert hour.slots[-1] == NOW.replace(second=0)
    assert hour.slots[0] == ago(59)
    assert hour.outcomes["completed"][-1] == 5
    assert hour.outcomes["dead"][-1] == 1
    assert hour.outcomes["failed"][-6] == 2
    assert sum(hour.outcomes["completed"]) == 5
    assert hour.mean_run[-1] == pytest.approx(6.0 / 6), "(2.0 + 4.0) / (4 + 2), not a mean of means"
    assert hour.mean_pickup[-1] == pytest.approx(0.25)
    assert hour.mean_run[-2] is None, "no run ended that minute"
    assert [(t.queue, t.kind) for t in hour.totals] == [
        ("mail", "bounce"),
        ("mail", "send"),
        ("reports", "build"),
    ]
    assert hour.queues == ["mail", "reports"]

    reports = _series.hour(minutes, NOW, queue="reports")
    assert [(t.queue, t.kind) for t in reports.totals] == [("reports", "build")]
    assert sum(reports.outcomes["completed"]) == 0
    assert reports.queues == ["mail", "reports"], "the filter still offers every queue"
    assert _series.hour([], NOW).empty


def test_stacked_bars_are_valid_svg_with_one_rect_per_nonzero_count() -> None:
    slots = [ago(2), ago(1), ago(0)]
    svg = _chart.stacked_bars(
        slots, [("completed", [3, 0, 1]), ("dead", [1, 0, 0])], label="Runs <ended>"
    )
    root = ET.fromstring(str(svg))
    rects = root.findall(f"{SVG}rect")
    assert [r.get("class") for r in rects] == ["s-completed", "s-dead", "s-completed"]
    heights = [float(r.get("height", "0")) for r in rects]
    assert heights[0] == pytest.approx(3 * heights[2], rel=0.01)
    assert heights[1] == pytest.approx(heights[2], rel=0.01)
    titles = [r.find(f"{SVG}title") for r in rects]
    assert next(t.text for t in titles if t is not None) == f"{ago(2):%H:%M} completed: 3"
    assert root.get("aria-label") == "Runs <ended>", "escaped in the markup, intact when parsed"
    assert "style=" not in str(svg), "a strict CSP refuses inline styles"


def test_a_line_breaks_where_a_minute_has_no_value() -> None:
    slots = [ago(i) for i in range(4, -1, -1)]
    svg = _chart.lines(slots, [("run", [1.0, 2.0, None, 4.0, 5.0])], label="run")
    root = ET.fromstring(str(svg))
    polylines = root.findall(f"{SVG}polyline")
    assert len(polylines) == 2
    assert [len(p.get("points", "").split()) for p in polylines] == [2, 2]
    assert len(root.findall(f"{SVG}circle")) == 4
