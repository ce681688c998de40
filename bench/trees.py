"""Running a measurement with another checkout's code, for the alternated before/after tools
(``bench.drain_ab``, ``bench.growth_ab``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_in_tree(tree: Path, code: str, *args: str) -> Any:
    """Run ``code`` (``python -c``, with ``args``) with ``cwd`` and ``PYTHONPATH`` set to
    ``tree``, so it imports that checkout's ``sqla_jobs`` and ``bench``; returns the JSON value
    its last line of output prints."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])
