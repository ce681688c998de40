"""The README (or a docs page) as data: its sections, code blocks and commands, for the tests that
hold it to what it says (tests/packaging/test_readme.py without a database,
tests/acceptance/test_readme_app.py and test_getting_started.py with one)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
#: The section a new user follows, from ``pip install`` to a job run by a worker.
FIVE_MINUTES = "Your application in five minutes"

_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def text(page: Path = README) -> str:
    return page.read_text(encoding="utf-8")


def section(title: str, page: Path = README) -> str:
    """The ``## title`` section of ``page`` (the README), up to the next ``##`` heading."""
    source = text(page)
    heading = f"\n## {title}\n"
    assert heading in source, f"{page.name} has no section {title!r}"
    return source.split(heading, 1)[1].split("\n## ", 1)[0]


def blocks(source: str, language: str) -> list[str]:
    """The code blocks of ``source`` in ``language`` (``python``, ``sh``, ``console``, ``ini``)."""
    return [body for lang, body in _BLOCK.findall(source) if lang == language]


def commands(source: str) -> list[tuple[str, ...]]:
    """The commands of ``source``, in order: every line of an ``sh`` block, and every ``$ `` line
    of a ``console`` block, split as the shell would (quotes, a trailing ``# comment``)."""
    found = []
    for lang, body in _BLOCK.findall(source):
        if lang == "sh":
            lines = body.splitlines()
        elif lang == "console":
            lines = [line[2:] for line in body.splitlines() if line.startswith("$ ")]
        else:
            continue
        found += [tuple(words) for line in lines if (words := shlex.split(line, comments=True))]
    return found


def console_output(source: str, command: str) -> list[str]:
    """The lines a ``console`` block of ``source`` prints after ``$ command``."""
    for body in blocks(source, "console"):
        lines = body.splitlines()
        for at, line in enumerate(lines):
            if line == f"$ {command}":
                rest = lines[at + 1 :]
                end = next((i for i, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                return rest[:end]
    raise AssertionError(f"the README shows no `$ {command}`")


def files(source: str) -> dict[str, str]:
    """The Python blocks of ``source`` that start with a ``# path/to/file.py`` comment, by path."""
    found = {}
    for body in blocks(source, "python"):
        first = body.partition("\n")[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            found[first[2:]] = body
    return found
