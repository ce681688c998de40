"""The throughput charts as inline SVG, drawn on the server: no JavaScript, no library, no CDN,
so the page works offline and under a CSP that allows nothing but the app itself.

Colours come from the stylesheet (one class per series, ``s-<name>``): a strict CSP refuses
``style`` attributes, not classes. Each bar and point carries a ``<title>``, the browser's own
tooltip, so the exact figures are a hover away without a script.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime

from markupsafe import Markup, escape

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 10, 26
#: Horizontal grid lines above zero: a fifth of any top :func:`nice_ceiling` gives is round.
GRID = 5
#: A time label every this many minutes.
LABEL_EVERY = 10

Format = Callable[[float], str]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value`` (and > 0), so
    that a fifth of it is a round number."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-9):
            return float(step * power)
    return float(10 * power)


def _frame(
    slots: Sequence[datetime], top: float, fmt: Format, label: str
) -> tuple[list[str], Callable[[int], float], Callable[[float], float], float]:
    """The SVG's opening, grid and axes; and the x of a slot, the y of a value, a slot's width."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(slots), 1)

    def x(i: int) -> float:
        return LEFT + i * step

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / top)

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(label)}</title>",
    ]
    for g in range(GRID + 1):
        value = top * g / GRID
        gy = y(value)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{escape(fmt(value))}</text>"
        )
    for i, slot in enumerate(slots):
        if i % LABEL_EVERY == 0 or i == len(slots) - 1:
            parts.append(
                f'<text class="tick" x="{x(i) + step / 2:.1f}" y="{HEIGHT - 8}" '
                f'text-anchor="middle">{slot:%H:%M}</text>'
            )
    return parts, x, y, step


def stacked_bars(
    slots: Sequence[datetime],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    label: str,
    fmt: Format = lambda v: f"{v:g}",
) -> Markup:
    """One bar per slot, the series stacked bottom up in the order given (counts: the scale
    reaches 5 at least, so that its steps are whole numbers)."""
    totals = [sum(values[i] for _, values in series) for i in range(len(slots))]
    top = max(nice_ceiling(max(totals, default=0)), float(GRID))
    parts, x, y, step = _frame(slots, top, fmt, label)
    width = max(step - 2, 1)
    for i, slot in enumerate(slots):
        base = 0.0
        for name, values in series:
            value = values[i]
            if value <= 0:
                continue
            y_top, y_base = y(base + value), y(base)
            parts.append(
                f'<rect class="s-{escape(name)}" x="{x(i) + 1:.1f}" y="{y_top:.1f}" '
                f'width="{width:.1f}" height="{y_base - y_top:.1f}">'
                f"<title>{slot:%H:%M} {escape(name)}: {escape(fmt(value))}</title></rect>"
            )
            base += value
    parts.append("</svg>")
    return Markup("\n".join(parts))


def lines(
    slots: Sequence[datetime],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    label: str,
    fmt: Format = lambda v: f"{v:g}",
) -> Markup:
    """One line per series; a slot without a value (None) breaks the line there."""
    values = [v for _, vs in series for v in vs if v is not None]
    top = nice_ceiling(max(values, default=0))
    parts, x, y, step = _frame(slots, top, fmt, label)
    for name, points in series:
        segment: list[str] = []
        for i, value in enumerate([*points, None]):
            if value is None:
                if len(segment) > 1:
                    parts.append(
                        f'<polyline class="s-{escape(name)}" points="{" ".join(segment)}"/>'
                    )
                segment = []
                continue
            cx, cy = x(i) + step / 2, y(value)
            segment.append(f"{cx:.1f},{cy:.1f}")
            parts.append(
                f'<circle class="s-{escape(name)}" cx="{cx:.1f}" cy="{cy:.1f}" r="2.5">'
                f"<title>{slots[i]:%H:%M} {escape(name)}: {escape(fmt(value))}</title></circle>"
            )
    parts.append("</svg>")
    return Markup("\n".join(parts))
