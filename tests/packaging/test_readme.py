"""The README cannot drift from what the package and the migrations guide do: its five-minute
application gives the commands docs/migrations.md gives (and tests/migrations runs), its
``sqla-jobs`` commands are ones the CLI accepts, its Python compiles, and its opening snippet is
the application's own. No database: tests/acceptance/test_readme_app.py runs the application."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sqla_jobs.cli.entry import build_parser
from tests import _readme
from tests.migrations._documented import DOC, documented_commands

GUIDE = DOC.read_text(encoding="utf-8")


def test_the_five_minute_alembic_commands_are_the_ones_the_migrations_guide_gives() -> None:
    """Word for word: the guide's commands are the ones tests/migrations runs end to end."""
    alembic = [
        c for c in _readme.commands(_readme.section(_readme.FIVE_MINUTES)) if c[0] == "alembic"
    ]

    assert alembic, "the five-minute application runs no alembic command"
    missing = [shlex.join(c) for c in alembic if c not in documented_commands()]
    assert missing == [], f"docs/migrations.md does not give: {missing}"
    # The ones a new user cannot do without, in the README itself.
    for needed in (
        ("alembic", "upgrade", "heads"),
        ("alembic", "downgrade", "myapp@-1"),
        (
            "alembic",
            "revision",
            "--autogenerate",
            "-m",
            "create orders",
            "--head=base",
            "--branch-label=myapp",
            "--version-path=migrations/versions",
        ),
    ):
        assert needed in alembic, f"the five-minute application does not run {shlex.join(needed)}"


def test_the_five_minute_alembic_edits_are_the_migrations_guides() -> None:
    """alembic.ini's lines and env.py's target_metadata, as the guide (and its tests) set them."""
    section = _readme.section(_readme.FIVE_MINUTES)
    (ini,) = _readme.blocks(section, "ini")
    guide_ini = "\n".join(_readme.blocks(GUIDE, "ini"))
    for line in ini.splitlines():
        if not line.startswith("sqlalchemy.url"):
            assert line in guide_ini.splitlines(), f"docs/migrations.md does not set {line!r}"
    env = next(b for b in _readme.blocks(section, "python") if "target_metadata" in b)
    assert env in _readme.blocks(GUIDE, "python")


def test_the_alembic_step_says_which_ini_lines_alembic_init_wrote_and_which_to_add(
    tmp_path: Path,
) -> None:
    """Added after ``alembic init``'s own, a setting it already wrote fails every command with
    DuplicateOptionError: the text names the lines to replace, and the ones to add."""
    section = _readme.section(_readme.FIVE_MINUTES)
    (ini,) = _readme.blocks(section, "ini")
    said = " ".join(section.split("```ini", 1)[0].strip().rsplit("\n\n", 1)[-1].split())
    replace, _, add = said.partition(" and add ")
    assert add, f"the step says nothing to add: {said!r}"
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "init", "migrations"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.returncode == 0
    written = (tmp_path / "alembic.ini").read_text()
    for line in ini.splitlines():
        key = line.split("=", 1)[0].strip()
        if re.search(rf"^{re.escape(key)} *=", written, flags=re.MULTILINE):
            assert "replace" in replace, said
            assert f"`{key}`" in replace, (key, said)
        else:
            assert f"`{key}`" in add, (key, said)
            assert f"`{key}`" not in replace, (key, said)


def test_the_install_section_gives_the_git_and_checkout_forms() -> None:
    install = _readme.commands(_readme.section("Install"))
    assert ("pip", "install", "sqla-jobs") in install
    assert ("pip", "install", "-e", ".") in install
    git = [c for c in install if c[:2] == ("pip", "install") and "git+https://" in c[-1]]
    assert git == [("pip", "install", "sqla-jobs @ git+https://github.com/sqla-jobs/sqla-jobs")]


def test_the_readmes_commands_use_the_five_minute_applications_schema() -> None:
    """The five-minute application keeps sqla-jobs in its own (public) schema: a command shown
    with ``--schema`` would fail for it."""
    parser = build_parser()
    for command in [c for c in _readme.commands(_readme.text()) if c[0] == "sqla-jobs"]:
        args = parser.parse_args(list(command[1:]))
        assert getattr(args, "schema", None) is None, shlex.join(command)


def test_every_sqla_jobs_command_of_the_readme_is_one_the_cli_accepts() -> None:
    commands = [c for c in _readme.commands(_readme.text()) if c[0] == "sqla-jobs"]
    assert len(commands) >= 10
    parser = build_parser()
    for command in commands:
        refused = io.StringIO()
        with contextlib.redirect_stderr(refused):
            try:
                parser.parse_args(list(command[1:]))
            except SystemExit:
                pytest.fail(f"`{shlex.join(command)}`: {refused.getvalue().strip()}")


@pytest.mark.parametrize(
    "block", _readme.blocks(_readme.text(), "python"), ids=lambda b: b.splitlines()[0][:40]
)
def test_every_python_block_of_the_readme_compiles(block: str) -> None:
    compile(block, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_the_opening_snippet_is_the_five_minute_applications_own() -> None:
    """The first code a reader sees runs as part of the application the acceptance test runs,
    flush included: ``order.id`` is read after the INSERT is sent."""
    opening = _readme.blocks(_readme.text().split("\n## ", 1)[0], "python")[0]
    checkout = _readme.files(_readme.section(_readme.FIVE_MINUTES))["myapp/checkout.py"]

    assert opening in checkout
    code = [line.split("#", 1)[0] for line in opening.splitlines()]
    flush = next(i for i, line in enumerate(code) if "session.flush()" in line)
    assert flush < next(i for i, line in enumerate(code) if "order.id" in line)


def test_the_readme_links_only_to_files_that_exist() -> None:
    """Its links to the repository (absolute, for the package index) name files of this
    checkout, on the branch the project publishes."""
    repository = "https://github.com/sqla-jobs/sqla-jobs/"
    root = Path(_readme.README).parent
    targets = re.findall(r"\]\((https://[^)\s]+)\)", _readme.text())
    for target in targets:
        for prefix in (f"{repository}blob/main/", f"{repository}tree/main/"):
            if target.startswith(prefix):
                path = target.removeprefix(prefix).split("#", 1)[0]
                assert (root / path).exists(), f"the README links to {target}: no such file"
        if target.startswith("https://raw.githubusercontent.com/sqla-jobs/sqla-jobs/main/"):
            path = target.removeprefix(
                "https://raw.githubusercontent.com/sqla-jobs/sqla-jobs/main/"
            )
            assert (root / path).exists(), f"the README shows {target}: no such file"


def test_the_readme_keeps_benchmark_history_out() -> None:
    """Performance in the README is a table with its date and command; the method and history
    are bench/README.md's. No commit hash, no account of earlier runs."""
    page = _readme.text()
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", page)
    assert hashes == []
    for phrase in ("previous session", "this session", "in an earlier run"):
        assert phrase not in page.lower()
    performance = _readme.section("Performance")
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", performance), "the table's date"
    assert "python -m bench" in performance, "the table's command"
