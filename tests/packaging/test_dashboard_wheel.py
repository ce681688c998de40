"""The wheel ships what the dashboard reads at run time besides its modules: its templates and
its stylesheet (package data, found through importlib.resources)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "sqla_jobs" / "dashboard"


def test_the_wheel_ships_every_template_and_the_stylesheet(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("sqla_jobs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        f"sqla_jobs/dashboard/{path.relative_to(DASHBOARD).as_posix()}"
        for folder in ("templates", "static")
        for path in (DASHBOARD / folder).iterdir()
    }
    assert "sqla_jobs/dashboard/static/dashboard.css" in wanted
    assert "sqla_jobs/dashboard/templates/base.html" in wanted
    assert wanted <= names, sorted(wanted - names)
