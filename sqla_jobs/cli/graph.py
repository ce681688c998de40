"""The dependencies of one job in ``sqla-jobs jobs show``: its parents and children with their
states (a parent whose row is gone shows the outcome its end recorded, else ``gone``), and how
many parents a waiting job still waits on.
"""

from __future__ import annotations

from typing import Any

from sqla_jobs.operations.relatives import Relative, Relatives


def relatives_json(rel: Relatives) -> dict[str, Any]:
    """The ``parents`` and ``children`` keys of ``jobs show --json`` (``*_truncated``: cut at
    the limit)."""
    return {
        "parents": [r.as_json() for r in rel.parents],
        "children": [r.as_json() for r in rel.children],
        "parents_truncated": rel.more_parents,
        "children_truncated": rel.more_children,
    }


def _line(r: Relative) -> str:
    what = r.kind if r.present else "(row gone)"
    anyway = ", runs anyway" if r.run_anyway else ""
    return f"    {r.id} {what}: {r.state}{anyway}"


def relatives_lines(rel: Relatives, waiting_on: int | None) -> list[str]:
    """The lines of ``jobs show`` on the job's dependencies: none for a job outside every
    graph."""
    lines = []
    if waiting_on is not None:
        lines.append(f"  waiting on     {waiting_on} parent{'' if waiting_on == 1 else 's'}")
    for title, items, more in (
        ("parents", rel.parents, rel.more_parents),
        ("children", rel.children, rel.more_children),
    ):
        if not items:
            continue
        lines.append(f"  {title:<14} {len(items)}{'+' if more else ''}")
        lines.extend(_line(r) for r in items)
        if more:
            lines.append("    ... (more not listed)")
    return lines
