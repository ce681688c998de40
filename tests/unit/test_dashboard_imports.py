"""The dashboard is an extra: the package and its command work without Starlette and Jinja2,
and load neither unless the dashboard is used."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_importing_sqla_jobs_and_building_the_cli_loads_no_dashboard_dependency() -> None:
    result = run(
        """
        import sys
        import sqla_jobs, sqla_jobs.cli, sqla_jobs.testing
        sqla_jobs.cli.build_parser()
        loaded = sorted(
            m for m in sys.modules
            if m.split(".")[0] in ("starlette", "jinja2", "uvicorn", "multipart", "python_multipart")
            or m.startswith("sqla_jobs.dashboard")
        )
        assert not loaded, loaded
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_without_the_extra_the_command_says_how_to_install_it() -> None:
    result = run(
        """
        import sys
        sys.modules["starlette"] = None  # as if the extra were not installed
        sys.modules["uvicorn"] = None
        from sqla_jobs.cli import main
        sys.exit(main(["dashboard", "--database-url", "postgresql://nowhere.invalid/db"]))
        """
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sqla-jobs: error: the dashboard needs its extra (")
    assert lines[0].endswith("pip install 'sqla-jobs[dashboard]'")
