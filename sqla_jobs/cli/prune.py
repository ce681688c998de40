"""``sqla-jobs prune`` (retention by hand) and the worker's retention flags.

``prune`` runs the pruner's own statements: bounded batches, each its own short transaction,
``SKIP LOCKED``. It does not take the pruner's election lock: an operator's prune runs even while
a worker prunes, and the two step over each other's rows instead of deleting them twice.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqla_jobs.cli.common import env_off
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.retention import (
    DEFAULT_RETENTION,
    FOREVER,
    Retention,
    format_duration,
    parse_duration,
)

#: Terminal states, in the order they are printed.
STATES = ("completed", "dead", "cancelled")


def add_retention_flags(worker: argparse.ArgumentParser) -> None:
    """The worker's ``--keep-*``, ``--no-prune`` and ``--prune-interval`` flags."""
    for state in STATES:
        default = format_duration(DEFAULT_RETENTION.by_state()[state])
        env = f"SQLA_JOBS_KEEP_{state.upper()}"
        worker.add_argument(
            f"--keep-{state}",
            default=os.environ.get(env) or default,
            metavar="DURATION",
            help=f"prune {state} jobs{' (and history)' if state == 'completed' else ''} this "
            f"long after they finished: 30s, 90m, 24h, 7d or {FOREVER} (env {env}; {default})",
        )
    default = format_duration(DEFAULT_RETENTION.throughput)
    worker.add_argument(
        "--keep-throughput",
        default=os.environ.get("SQLA_JOBS_KEEP_THROUGHPUT") or default,
        metavar="DURATION",
        help="prune the per-minute throughput counts (the dashboard's chart) this long after "
        f"their minute: 30s, 90m, 24h, 7d or {FOREVER} (env SQLA_JOBS_KEEP_THROUGHPUT; {default})",
    )
    worker.add_argument(
        "--no-prune",
        action="store_true",
        default=env_off("PRUNE"),
        help="never prune finished jobs from this worker (env SQLA_JOBS_PRUNE=0)",
    )
    worker.add_argument(
        "--prune-interval",
        default=os.environ.get("SQLA_JOBS_PRUNE_INTERVAL") or "5m",
        metavar="DURATION",
        help="time between prune runs; one worker at a time prunes "
        "(env SQLA_JOBS_PRUNE_INTERVAL; 5m)",
    )


def retention_options(args: argparse.Namespace) -> dict[str, Any]:
    """``Worker(...)`` keyword arguments from the flags of :func:`add_retention_flags`."""
    if args.no_prune:
        return {"retention": None}
    keep = {state: _keep(getattr(args, f"keep_{state}"), f"--keep-{state}") for state in STATES}
    keep["throughput"] = _keep(args.keep_throughput, "--keep-throughput")
    interval = _duration(args.prune_interval, "--prune-interval")
    return {"retention": Retention(**keep), "prune_interval": interval.total_seconds()}


def _keep(text: str, flag: str) -> timedelta | None:
    return None if text.strip().lower() == FOREVER else _duration(text, flag)


def _duration(text: str, flag: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigurationError(f"{flag}: {exc}") from None


def add_prune_command(
    sub: Any,
    db: Callable[[argparse.ArgumentParser], None],
    epilog: str,
    url_of: Callable[[argparse.Namespace], str],
    check_reachable: Callable[[str], None],
) -> argparse.ArgumentParser:
    """Add ``sqla-jobs prune`` to the subparsers ``sub``: ``db`` adds ``--database-url``,
    ``url_of`` reads the URL from the arguments, ``check_reachable`` raises the CLI's one-line
    error (exit 3) if the database cannot be reached.

    The CLI's helpers are passed in rather than imported: under ``python -m sqla_jobs.cli`` the
    command's module is ``__main__``, and an import of ``sqla_jobs.cli`` would be a second copy."""
    p: argparse.ArgumentParser = sub.add_parser(
        "prune",
        help="delete finished jobs older than a duration (what the workers' pruner does)",
        epilog=epilog,
    )
    db(p)
    p.add_argument(
        "--older-than",
        metavar="DURATION",
        help="finished longer ago than this: 30s, 90m, 24h, 7d (required)",
    )
    p.add_argument(
        "--state",
        action="append",
        metavar="STATE",
        help="completed (job rows and history), dead or cancelled; repeat for several "
        "(default: all three)",
    )
    p.add_argument(
        "--schema", default=os.environ.get("SQLA_JOBS_SCHEMA"), help="schema of the queue table"
    )
    p.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
    p.set_defaults(
        func=lambda args: cmd_prune(args, lambda: _reachable(args, url_of, check_reachable))
    )
    return p


def _reachable(
    args: argparse.Namespace,
    url_of: Callable[[argparse.Namespace], str],
    check_reachable: Callable[[str], None],
) -> str:
    url = url_of(args)
    check_reachable(url)
    return url


def cmd_prune(args: argparse.Namespace, database: Callable[[], str]) -> int:
    """Prune (or count, ``--dry-run``) on the database ``database()`` returns once reachable;
    print one line per state; 0. Bad input raises :class:`ConfigurationError` (exit 2) before
    the database is reached."""
    import psycopg

    from sqla_jobs.db.preflight import check_job_table
    from sqla_jobs.db.urls import libpq_conninfo
    from sqla_jobs.worker import pruner as _pruner

    if args.older_than is None:
        raise ConfigurationError("prune needs --older-than DURATION (e.g. --older-than 7d)")
    older_than = _duration(args.older_than, "--older-than")
    states = list(dict.fromkeys(args.state or STATES))
    bad = [s for s in states if s not in STATES]
    if bad:
        raise ConfigurationError(
            f"--state {bad[0]!r} is not a finished state: choose from {', '.join(STATES)}"
        )
    url = database()
    check_job_table(
        url,
        args.schema,
        lambda schema: f"run with --schema {schema} (or SQLA_JOBS_SCHEMA={schema})",
    )
    sql = _pruner.PruneSQL(args.schema)
    ages = {state: (older_than if state in states else None) for state in STATES}
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        counts = (
            _pruner.count(conn, sql, ages)
            if args.dry_run
            else _pruner.prune(conn, sql, ages, rest=lambda took: time.sleep(took * _pruner.REST))
        )
    verb = "would prune" if args.dry_run else "pruned"
    age = args.older_than.strip()
    for state in states:
        line = f"{verb} {_count(counts[state], f'{state} job')}"
        if state == "completed":
            line += f" and {_count(counts[_pruner.HISTORY], 'history row')}"
        print(f"{line} finished more than {age} ago")
    return 0


def _count(n: int, noun: str) -> str:
    """``1 dead job``, ``2 dead jobs``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
