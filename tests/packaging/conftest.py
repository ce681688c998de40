"""The wheel, built once per test session for every test that looks inside it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, built from this checkout by its build backend."""
    out = tmp_path_factory.mktemp("wheel")
    if importlib.util.find_spec("hatchling") is not None:
        # The backend itself, when the test extra brought it: no build environment to set up.
        command = [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)]
    else:
        command = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(out)]
    built = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("sqla_jobs-*.whl")
    return wheel
