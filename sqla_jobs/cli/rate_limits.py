"""``sqla-jobs rate-limits``: each rate limiter's limit, its starts in the window now, and when it
admits its next start, as its last claim left it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.pool import NullPool

from sqla_jobs.cli.common import EXIT_OK, add_database_options, prepared_url
from sqla_jobs.db.preflight import _migrate
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.errors import NotMigratedError
from sqla_jobs.observe.limiters import COLUMNS, Limiter, limiters


def cmd_rate_limits(args: argparse.Namespace) -> int:
    url = prepared_url(args)
    schema = getattr(args, "schema", None)
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = limiters(conn, schema)
    except ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) != "42P01":  # undefined_table
            raise
        raise NotMigratedError(
            "no table sqla_jobs_rate_limiter: the database predates rate limits",
            f"to create it, {_migrate(schema)}",
        ) from None
    finally:
        engine.dispose()
    print(render(rows, as_json=args.json))
    return EXIT_OK


def render(rows: Sequence[Limiter], *, as_json: bool) -> str:
    """The limiters as a table, or as JSON lines."""
    values = [r.values() for r in rows]
    if as_json:
        return "\n".join(json.dumps(dict(zip(COLUMNS, v, strict=True))) for v in values)
    if not values:
        return "(no rate limiter has started a job in its window)"
    lines = [f"{'kind':<24} {'key':<24} {'limit':>12}  {'used':>5}  next start"]
    for kind, key, limit, per, used, next_in, _ in values:
        nxt = f"in {next_in:.1f}s" if next_in > 0 else "now"
        lines.append(f"{kind:<24} {key or '-':<24} {f'{limit}/{per:g}s':>12}  {used:>5}  {nxt}")
    return "\n".join(lines)


def register(sub: Any, epilog: str) -> None:
    """Add ``rate-limits`` to the ``sqla-jobs`` sub-commands ``sub``."""
    p = sub.add_parser(
        "rate-limits",
        help="each rate limiter: its limit, its starts in the window now, its next allowed start",
        epilog=epilog,
    )
    add_database_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object per limiter, one per line")
    p.set_defaults(func=cmd_rate_limits)
