"""Render RELIABILITY.md from the figures the chaos run wrote (``SQLA_JOBS_FIGURES``).

python -m tests.reliability.report FIGURES.jsonl > RELIABILITY.md
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

HEADER = """# Reliability

Every row is an automated test that injects a real fault into real worker processes and a real
PostgreSQL, in `tests/reliability/`. The default test command runs each scenario scaled down;
`nox -s chaos` runs them at full size and regenerates this file from the figures they record.
"""


def render(lines: list[dict[str, object]]) -> str:
    out = [HEADER]
    if lines:
        first = lines[0]
        out.append(
            f"Figures from the run of {first['at']} ({first['scale']} scale) on "
            f"{platform.system()} {platform.machine()}, Python {platform.python_version()}.\n"
        )
    out.append("| scenario | injects | figures | reproduce |")
    out.append("| --- | --- | --- | --- |")
    for line in lines:
        figs = line["figures"]
        assert isinstance(figs, dict)
        shown = ", ".join(f"{k}={v}" for k, v in figs.items())
        out.append(f"| {line['scenario']} | {line['injects']} | {shown} | `{line['command']}` |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else None
    if path is None or not path.exists():
        print("usage: python -m tests.reliability.report FIGURES.jsonl", file=sys.stderr)
        return 2
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    # Latest figures per test win.
    latest = {line["node"]: line for line in lines}
    sys.stdout.write(render(sorted(latest.values(), key=lambda x: x["node"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
