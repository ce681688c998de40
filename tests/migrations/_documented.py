"""The commands docs/migrations.md gives, so that a test runs exactly what the page says.

A command is a line of a ``sh`` code block, or an inline code span, that starts with ``alembic``
or ``sqla-jobs``; it is split as the shell would (quotes, a trailing ``# comment``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from functools import cache
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrations.md"
_PROGRAMS = ("alembic", "sqla-jobs")
_FENCE = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`((?:alembic|sqla-jobs) [^`]+)`")


@cache
def documented_commands() -> frozenset[tuple[str, ...]]:
    """Every command of the page, as the shell would split it."""
    text = DOC.read_text(encoding="utf-8")
    lines = [line for block in _FENCE.findall(text) for line in block.splitlines()]
    lines += _INLINE.findall(text)
    found = set()
    for line in lines:
        words = shlex.split(line, comments=True)
        if words and words[0] in _PROGRAMS:
            found.add(tuple(words))
    return frozenset(found)


def documented(*command: str) -> Sequence[str]:
    """``command``, once it is checked to be on the page word for word; else the test fails."""
    assert command in documented_commands(), (
        f"docs/migrations.md does not give `{shlex.join(command)}`; it gives: "
        + "; ".join(sorted(shlex.join(c) for c in documented_commands()))
    )
    return command[1:]
