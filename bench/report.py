"""The results: a table on stdout, the raw figures as JSON (and Markdown), the sustained-run plot."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .figures import Row, Series


def fmt(value: float, unit: str = "") -> str:
    """A figure with as many digits as it deserves."""
    if value != value or math.isinf(value):
        return "-"
    if unit == "bool":
        return "yes" if value >= 1 else "no"
    a = abs(value)
    if a >= 1000:
        return f"{value:,.0f}"
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def cell(series: Series | None, unit: str) -> str:
    if series is None or not series.samples:
        return ""
    if len(series.samples) == 1 or unit == "bool":
        if unit == "bool" and len(series.samples) > 1:
            yes = sum(1 for v in series.samples if v >= 1)
            return f"{fmt(series.median, unit)} ({yes}/{len(series.samples)})"
        return fmt(series.median, unit)
    return f"{fmt(series.median, unit)} [{fmt(series.low, unit)}-{fmt(series.high, unit)}]"


def verdict(row: Row) -> str:
    meets = row.meets
    return "" if row.target is None else {True: "PASS", False: "FAIL", None: "n/a"}[meets]


HEADER = ("measurement", "unit", "sqla-jobs median [min-max]", "baseline median [min-max]",
          "baseline is", "ratio", "target", "meets?")  # fmt: skip


def cells(row: Row) -> tuple[str, ...]:
    ratio = row.ratio
    name = row.name if row.subject_label == "sqla-jobs" else f"{row.name} [{row.subject_label}]"
    return (
        f"{row.group}: {name}",
        row.unit,
        cell(row.subject, row.unit),
        cell(row.baseline, row.unit),
        row.baseline_label,
        "" if ratio is None else f"{ratio:.2f}x",
        "" if row.target is None else row.target.describe(),
        verdict(row),
    )


def table(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table, with notes underneath."""
    body = [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in [HEADER, *body]) for i in range(len(HEADER))]
    width = shutil.get_terminal_size((200, 40)).columns
    lines = []
    for i, line in enumerate([HEADER, *body]):
        text = "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        lines.append(text)
        if i == 0:
            lines.append("-" * min(len(text), max(width, 80)))
    notes = [f"- {r.group}: {r.name}: {r.note}" for r in rows if r.note]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def markdown(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table."""
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |" for r in rows]
    notes = [f"- {r.group}: {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(out + (["", *notes] if notes else [])) + "\n"


def _json_default(obj: object) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    return str(obj)


def write(
    results_dir: Path, stamp: str, meta: dict[str, Any], rows: Sequence[Row], raw: dict[str, Any]
) -> Path:
    """Write ``<stamp>.json`` and ``<stamp>.md`` (and copy them to ``latest.*``); return the JSON."""
    results_dir.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "rows": [r.as_dict() for r in rows], "raw": raw}
    text = json.dumps(_nan_to_none(doc), indent=1, default=_json_default)
    path = results_dir / f"{stamp}.json"
    path.write_text(text)
    (results_dir / "latest.json").write_text(text)
    md = markdown(rows)
    (results_dir / f"{stamp}.md").write_text(md)
    (results_dir / "latest.md").write_text(md)
    return path


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and (obj != obj or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


PANELS = (
    ("table_bytes", "table size (MB)", 2**20),
    ("index_bytes", "index size (MB)", 2**20),
    ("n_dead_tup", "dead tuples", 1),
    ("autovacuum_count", "autovacuum runs", 1),
    ("queue_depth", "queue depth (pending jobs)", 1),
    ("rss_kb", "worker RSS (MB)", 1024),
)


def plot_sustained(sustained: dict[str, Any], path: Path) -> Path | None:
    """Plot the sustained run's samples (one line per repetition) to ``path``; None, with a
    message, when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "matplotlib is not installed: skipping the sustained-run plot (pip install matplotlib)"
        )
        return None
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    for ax, (key, title, scale) in zip(axes.flat, PANELS, strict=False):
        for i, run in enumerate(sustained.get("runs", [])):
            ts = [s["t"] for s in run["samples"]]
            ax.plot(ts, [s[key] / scale for s in run["samples"]], label=f"run {i + 1}")
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(
        f"sqla-jobs sustained load: {sustained.get('rate', '?'):g} jobs/s for "
        f"{sustained.get('duration', '?'):g} s (server autovacuum = {sustained.get('autovacuum')})"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    shutil.copyfile(path, path.parent / "latest-sustained.png")
    return path
