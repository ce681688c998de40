"""The ``sqla-jobs`` command's own texts: ``--help`` of every sub-command is plain text and says
what the code does; ``--version`` names the installed distribution. No database."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from importlib.metadata import version

import pytest

from sqla_jobs.cli.entry import build_parser, main
from sqla_jobs.worker import prefetch as _prefetch

#: reStructuredText a terminal shows as is: literals, roles, interpreted text.
RST = re.compile(r"``|`|:(?:class|func|meth|mod|data|attr|exc|obj|ref|doc):")


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``sqla-jobs`` and every sub-command under it, at any depth, by their command line."""
    todo = [("sqla-jobs", build_parser())]
    while todo:
        name, parser = todo.pop()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend((f"{name} {sub}", p) for sub, p in action.choices.items())


def help_of(command: str) -> str:
    (parser,) = (p for name, p in parsers() if name == command)
    # Wide enough that no text is wrapped in the middle of what a test looks for.
    return " ".join(parser.format_help().split())


def test_every_help_text_is_plain_text_without_restructuredtext() -> None:
    found = {name: RST.findall(parser.format_help()) for name, parser in parsers()}

    assert len(found) > 10, sorted(found)  # the walk reached the nested sub-commands
    assert {name: marks for name, marks in found.items() if marks} == {}


def test_prefetch_help_states_the_automatic_sizing_the_code_applies() -> None:
    text = help_of("sqla-jobs worker")
    assert "4x" not in text
    assert f"about {_prefetch.HORIZON:g} s at the handlers' average run time" in text
    assert f"at most {_prefetch.CAP}" in text
    assert f"over {_prefetch.SHORT_JOB * 1000:g} ms" in text

    prefetch = _prefetch.Prefetch(concurrency=4)
    assert prefetch.size == 0  # "none before the first jobs finish"
    prefetch.resize(0.01)
    assert prefetch.size == int(4 * _prefetch.HORIZON / 0.01)  # 0.1 s of 4 slots' work
    prefetch.resize(1e-5)
    assert prefetch.size == _prefetch.CAP
    prefetch.resize(_prefetch.SHORT_JOB * 1.2)
    assert prefetch.size == 0


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("sqla-jobs worker", "default: the queues of the kinds that have handlers"),
        ("sqla-jobs worker", "move each completed job into sqla_jobs_history instead of deleting"),
        ("sqla-jobs worker", "TOML (FILE.toml, Python 3.11 or later)"),
        ("sqla-jobs migrate", "recorded in sqla_jobs_alembic_version"),
        ("sqla-jobs migrate", "default: the first schema of the search_path"),
        ("sqla-jobs migrate", "without running it or connecting"),
    ],
)
def test_help_says_what_the_code_does(command: str, says: str) -> None:
    assert says in help_of(command)


def test_version_prints_the_installed_distributions_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])

    assert exited.value.code == 0
    assert capsys.readouterr().out == f"sqla-jobs {version('sqla-jobs')}\n"
