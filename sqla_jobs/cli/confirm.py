"""The confirmation of ``jobs retry/delete/cancel`` by filter (``--all-dead``, ``--queue``): they
count what they would touch first and go on only when told to.

Ids given on the command line are what the operator named, and run at once; a filter may match
thousands of jobs, so it is counted (:mod:`sqla_jobs.operations.preview`) and: with ``--dry-run``,
listed and nothing done; with ``--yes``, run; on a terminal, shown with a ``[y/N]`` prompt, and a
yes runs it on the jobs counted only (a job that matches after the count is left alone, one that
no longer matches is skipped); not on a terminal, refused (exit 2) with nothing changed, so that
a script says ``--yes`` for what it means to do.
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.orm import Session

from sqla_jobs.cli.common import EXIT_ERROR, EXIT_OK, CLIError
from sqla_jobs.operations.jobs import Bound, Scope
from sqla_jobs.operations.preview import Preview, preview


def add_options(parser: argparse.ArgumentParser, filters: str) -> None:
    """``--yes`` and ``--dry-run`` on a command whose ``filters`` select jobs by filter."""
    parser.add_argument(
        "--yes",
        action="store_true",
        help=f"with {filters}: run without asking (needed when not on a terminal)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="say which jobs it would touch, and change nothing",
    )


def _counted(
    session: Session, scope: Scope, verb: str, kind: str | None, queue: str | None
) -> Preview:
    # A transaction of its own, ended before any prompt: nobody holds a snapshot while a person
    # reads the question.
    with session.begin():
        return preview(session, scope, verb, kind=kind, queue=queue)


def dry_run(session: Session, scope: Scope, verb: str, kind: str | None, queue: str | None) -> int:
    """Print what ``verb`` by filter would touch now; change nothing."""
    first, *rest = _counted(session, scope, verb, kind, queue).lines()
    print("would " + first)
    for line in rest:
        print(line)
    return EXIT_OK


def confirmed(
    args: argparse.Namespace,
    session: Session,
    scope: Scope,
    verb: str,
    kind: str | None,
    queue: str | None,
) -> Bound | None:
    """Whether ``verb`` by filter may run, and within what: None (no bound) with ``--yes``, the
    jobs counted after a yes at the prompt; raises :class:`CLIError` (nothing changed) when not
    on a terminal (exit 2) or when the answer is not yes (exit 1)."""
    if args.yes:
        return None
    counted = _counted(session, scope, verb, kind, queue)
    if not sys.stdin.isatty():
        raise CLIError(
            f"{verb} by filter asks before it runs, and this is not a terminal: it would {verb} "
            f"{counted.jobs()} ({counted.where()}); pass --yes to run it, or --dry-run to list "
            "them: nothing changed"
        )
    if not counted.touched:
        return counted.bound()
    for line in counted.lines():
        print(line)
    try:
        answer = input(f"{verb} {counted.jobs()}? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise CLIError(f"{verb} not confirmed: nothing changed", EXIT_ERROR)
    return counted.bound()
