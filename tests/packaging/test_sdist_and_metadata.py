"""What the package index shows: the README's links work away from the repository, the license
and the project's addresses are in the metadata, and the sdist carries the documents the README
points to. No database."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPOSITORY = "https://github.com/sqla-jobs/sqla-jobs"
#: A Markdown link or image target.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_readme_link_works_on_the_package_index() -> None:
    """The index renders the README away from the repository: a relative link (docs/roles.md,
    RELIABILITY.md) leads nowhere there. Only absolute addresses and anchors of the page."""
    targets = LINK.findall((REPO / "README.md").read_text(encoding="utf-8"))

    assert any(t.startswith(f"{REPOSITORY}/blob/main/docs/") for t in targets)
    assert f"{REPOSITORY}/blob/main/RELIABILITY.md" in targets
    assert [t for t in targets if not t.startswith(("https://", "http://", "#"))] == []


def test_the_project_has_an_mit_license_file_and_its_addresses() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    license_text = (REPO / "LICENSE").read_text(encoding="utf-8")

    assert project["license"] == "MIT"
    assert license_text.startswith("MIT License\n\nCopyright (c) 2026 the sqla-jobs authors\n")
    assert project["urls"] == {
        "Homepage": REPOSITORY,
        "Documentation": "https://sqla-jobs.readthedocs.io",
        "Source": REPOSITORY,
        "Issues": f"{REPOSITORY}/issues",
    }


@pytest.mark.slow
def test_the_sdist_carries_the_documents_the_readme_points_to(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = tmp_path.glob("*.tar.gz")

    with tarfile.open(sdist) as archive:
        files = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {
        "LICENSE",
        "README.md",
        "RELIABILITY.md",
        "docs/migrations.md",
        "docs/roles.md",
        "examples/shop/README.md",
        "sqla_jobs/migrations/versions/sqla_jobs_0001_job_table.py",
    } <= files


def test_the_wheel_names_its_license_and_the_projects_addresses(built_wheel: Path) -> None:
    """(What the wheel holds, and what it must not, is test_wheel.py's.)"""
    with zipfile.ZipFile(built_wheel) as archive:
        names = archive.namelist()
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        headers = archive.read(metadata).decode()

    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in headers
    assert f"Project-URL: Source, {REPOSITORY}" in headers
    assert "Project-URL: Documentation, https://sqla-jobs.readthedocs.io" in headers
