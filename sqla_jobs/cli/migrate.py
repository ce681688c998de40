"""``sqla-jobs migrate``: create or upgrade sqla-jobs' tables (:mod:`sqla_jobs.migrate`).

Every failure is one line on stderr: an unreachable database (exit 3), a database whose
sqla-jobs revisions another Alembic environment runs (exit 2, nothing changed), an error of
Alembic's (exit 1).
"""

from __future__ import annotations

import argparse
from typing import Any

from sqla_jobs.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    CLIError,
    add_database_options,
    check_reachable,
    database_url,
    env,
)


def cmd_migrate(args: argparse.Namespace) -> int:
    from alembic.util import CommandError

    from sqla_jobs.migrate import upgrade

    url = database_url(args)
    if args.sql and args.adopt:
        raise CLIError("--adopt moves rows in the database: it cannot go with --sql")
    if not args.sql:
        check_reachable(url)
    try:
        migrated = upgrade(url, schema=args.schema, sql=args.sql, adopt=args.adopt)
    except CommandError as exc:
        raise CLIError(f"alembic: {exc}", EXIT_ERROR) from None
    if not args.sql:
        print(migrated.summary())
    return EXIT_OK


def register(sub: Any, epilog: str) -> None:
    """Add ``migrate`` to the ``sqla-jobs`` sub-commands ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "migrate",
        help="create or upgrade sqla-jobs' tables, for applications that do not run its "
        "revisions in an Alembic environment of their own",
        description="Create or upgrade sqla-jobs' tables to the newest revision this version "
        "ships. The revisions are recorded in sqla_jobs_alembic_version, never in the "
        "application's alembic_version. A database whose sqla-jobs revisions an earlier "
        "sqla-jobs migrate recorded in alembic_version is taken over; one whose revisions the "
        "application's own Alembic environment runs is refused, unchanged.",
        epilog=epilog,
    )
    add_database_options(p, schema=False)
    p.add_argument(
        "--schema",
        default=env("SCHEMA"),
        help="schema for sqla-jobs' tables and its version table; it must exist "
        "(env SQLA_JOBS_SCHEMA; default: the first schema of the search_path)",
    )
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the SQL that creates everything from an empty database, without running it "
        "or connecting",
    )
    p.add_argument(
        "--adopt",
        action="store_true",
        help="take sqla-jobs' revisions out of an alembic_version shared with your "
        "application's revisions, once your Alembic environment no longer lists "
        "sqla_jobs:migrations/versions",
    )
    p.set_defaults(func=cmd_migrate)
