"""What a measurement produces: repeated samples, the row that compares them, and its target."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

TargetKind = Literal["ratio_min", "ratio_max", "abs_min", "abs_max", "true"]


@dataclass
class Series:
    """One figure, measured once per repetition."""

    samples: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.samples.append(float(value))

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def low(self) -> float:
        return min(self.samples) if self.samples else float("nan")

    @property
    def high(self) -> float:
        return max(self.samples) if self.samples else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "samples": self.samples}


@dataclass(frozen=True)
class Target:
    """A goal a row should meet: on the ratio to the baseline, or on the absolute figure."""

    kind: TargetKind
    value: float = 0.0
    unit: str = ""

    def describe(self) -> str:
        if self.kind == "ratio_min":
            return f">= {self.value:g}x"
        if self.kind == "ratio_max":
            return f"<= {self.value:g}x"
        if self.kind == "abs_min":
            return f">= {self.value:g} {self.unit}".rstrip()
        if self.kind == "abs_max":
            return f"<= {self.value:g} {self.unit}".rstrip()
        return "yes"

    def check(self, value: float, ratio: float | None) -> bool | None:
        if self.kind in ("ratio_min", "ratio_max"):
            if ratio is None or ratio != ratio:
                return None
            return ratio >= self.value if self.kind == "ratio_min" else ratio <= self.value
        if value != value:
            return None
        if self.kind == "abs_min":
            return value >= self.value
        if self.kind == "abs_max":
            return value <= self.value
        return value >= 1.0


@dataclass
class Row:
    """One line of the results table: sqla-jobs' figure, the baseline's, their ratio, the target."""

    group: str
    name: str
    unit: str
    subject: Series
    baseline: Series | None = None
    baseline_label: str = ""
    target: Target | None = None
    note: str = ""
    #: What the subject column holds when it is not sqla-jobs (the contention rows).
    subject_label: str = "sqla-jobs"
    #: The ratio is the median of the same-repetition ratios, not the ratio of the medians: for
    #: two loops measured side by side in each repetition, a drift of the machine between
    #: repetitions moves both sides of one ratio together.
    paired: bool = False

    @property
    def ratio(self) -> float | None:
        """sqla-jobs' median over the baseline's median, or with :attr:`paired` the median of the
        repetitions' ratios (None without a baseline)."""
        if self.baseline is None or not self.baseline.samples or not self.subject.samples:
            return None
        if self.paired and len(self.subject.samples) == len(self.baseline.samples):
            pairs = zip(self.subject.samples, self.baseline.samples, strict=True)
            ratios = [a / b for a, b in pairs if b]
            return statistics.median(ratios) if ratios else None
        base = self.baseline.median
        return self.subject.median / base if base else None

    @property
    def meets(self) -> bool | None:
        if self.target is None:
            return None
        return self.target.check(self.subject.median, self.ratio)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "unit": self.unit,
            "subject": self.subject.as_dict(),
            "subject_label": self.subject_label,
            "baseline": None if self.baseline is None else self.baseline.as_dict(),
            "baseline_label": self.baseline_label,
            "ratio": self.ratio,
            "paired": self.paired,
            "target": None if self.target is None else self.target.describe(),
            "meets": self.meets,
            "note": self.note,
        }


@dataclass
class Outcome:
    """What one measurement module returns: its rows, and raw data for the JSON (and plots)."""

    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
