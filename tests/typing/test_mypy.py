"""mypy over the snippets in ``cases/``: the handler and option typing of ``register`` and ``@kind``.

Each ``ok_*.py`` must type-check clean; each ``bad_*.py`` must produce exactly the errors its lines
announce with a trailing ``# E: <substring of the message>``, and no others. One mypy run (the
project's config and pydantic plugin, a fresh cache in tmp) checks them all. The case files are
never imported: their names are not ``test_*``, and the bad ones would fail at run time too.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from sqla_jobs import KindOptions

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "cases"
CASE_FILES = sorted(CASES.glob("*.py"))
GENERATED = "ok_every_kind_option.py"

_MARK = "# E:"
_ERROR = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: (?P<message>.*)$")
_CHECKED = re.compile(r"(?:checked|found in) (\d+) source files?")

Lines = dict[int, list[str]]


def every_kind_option() -> str:
    """A case passing every field of KindOptions to register by name, with a value of the field's
    own type: a field added to KindOptions but not to KindArgs fails it. (The other way round,
    register passing KindArgs to KindOptions(**...) makes mypy refuse a key KindOptions lacks.)"""
    names = [f.name for f in dataclasses.fields(KindOptions)]
    options = ", ".join(f"{name}=DEFAULTS.{name}" for name in names)
    return (
        "from pydantic import BaseModel\n\n"
        "from sqla_jobs import Jobs, KindOptions\n\n"
        "DEFAULTS = KindOptions()\n\n\n"
        "class Payload(BaseModel):\n"
        "    pass\n\n\n"
        f'Jobs().register("every_option", Payload, {options})\n'
    )


def expected_errors(path: Path) -> Lines:
    """The ``# E:`` substrings of ``path``, by line (a line may announce several)."""
    expected: Lines = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if _MARK in line:
            expected[number] = [part.strip() for part in line.split(_MARK)[1:]]
    return expected


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Lines]:
    """mypy's errors over every case, by file name and line."""
    pytest.importorskip("mypy", reason="mypy is in the dev extra (nox -s typecheck)")
    tmp = tmp_path_factory.mktemp("typing")
    generated = tmp / GENERATED
    generated.write_text(every_kind_option())
    files = [str(p) for p in [*CASE_FILES, generated]]
    args = [
        *("--config-file", str(REPO / "pyproject.toml")),
        *("--cache-dir", str(tmp / "mypy_cache")),
        # Types from the package, errors only from the cases (`nox -s typecheck` checks the
        # package itself).
        *("--follow-imports", "silent"),
        *("--show-absolute-path", "--no-pretty", "--no-color-output", "--show-error-codes"),
        *files,
    ]
    # A process of its own: mypy.api.run in this one takes twice the CPU (mypy's exit skips
    # freeing its heap; here the heap would be freed) and raises the recursion limit for good.
    # From the repository root: `sqla_jobs` is this checkout's, whatever the venv has installed.
    run = subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    stdout, stderr, status = run.stdout, run.stderr, run.returncode
    assert status in (0, 1), f"mypy crashed ({status}):\n{stderr}{stdout}"
    checked = _CHECKED.search(stdout)
    assert checked is not None, stdout
    assert int(checked.group(1)) == len(files), stdout
    errors: dict[str, Lines] = defaultdict(lambda: defaultdict(list))
    for line in stdout.splitlines():
        match = _ERROR.match(line)
        if match:
            name = Path(match["path"]).name
            errors[name][int(match["line"])].append(match["message"])
    unexpected = set(errors) - {p.name for p in CASE_FILES} - {GENERATED}
    assert not unexpected, f"errors outside the cases:\n{stdout}"
    return errors


def test_the_cases_cover_both_sides() -> None:
    """A guard on the harness: clean cases and failing cases exist, named by what they expect."""
    assert all(p.name.startswith(("ok_", "bad_")) for p in CASE_FILES)
    oks = [p for p in CASE_FILES if p.name.startswith("ok_")]
    bads = [p for p in CASE_FILES if p.name.startswith("bad_")]
    assert oks
    assert bads
    assert not any(expected_errors(p) for p in oks)
    assert all(expected_errors(p) for p in bads)


@pytest.mark.parametrize("case", CASE_FILES, ids=lambda p: p.name)
def test_mypy_reports_exactly_the_expected_errors(
    case: Path, mypy_errors: dict[str, Lines]
) -> None:
    expected = expected_errors(case)
    actual = mypy_errors.get(case.name, {})
    problems = []
    for line in sorted(set(expected) | set(actual)):
        wanted, got = expected.get(line, []), actual.get(line, [])
        missing = [w for w in wanted if not any(w in g for g in got)]
        extra = [g for g in got if not any(w in g for w in wanted)]
        problems += [f"{case.name}:{line}: expected an error containing {w!r}" for w in missing]
        problems += [f"{case.name}:{line}: unexpected error: {g}" for g in extra]
        if missing and got:
            problems.append(f"  (mypy said: {' | '.join(got)})")
    assert not problems, "\n".join(problems)


def test_every_kind_option_is_a_typed_keyword_of_register(mypy_errors: dict[str, Lines]) -> None:
    assert dict(mypy_errors.get(GENERATED, {})) == {}, every_kind_option()
