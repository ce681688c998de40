"""``sqla-jobs workers`` (the registry of live workers) and the worker's metrics flags
(``--metrics-port``, ``--metrics-host``, ``--metrics-interval``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.pool import NullPool

from sqla_jobs.cli.common import EXIT_OK, CLIError, add_database_options, env, prepared_url
from sqla_jobs.db.preflight import _migrate
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.errors import NotMigratedError
from sqla_jobs.sql import workers as workers_sql

if TYPE_CHECKING:
    from sqla_jobs.observe.metrics import Metrics

#: The columns of a worker's JSON line, in order.
COLUMNS = (
    "name",
    "host",
    "pid",
    "queues",
    "concurrency",
    "started_at",
    "heartbeat_at",
    "heartbeat_age_seconds",
    "stale",
)


def add_metrics_flags(parser: argparse.ArgumentParser, number: Callable[..., Any]) -> None:
    """The worker's metrics flags; ``number(name, type, default)`` reads ``SQLA_JOBS_<name>``."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=number("METRICS_PORT", int, None),
        help="serve Prometheus metrics (/metrics) and /healthz on this port; needs the metrics "
        "extra, pip install 'sqla-jobs[metrics]' (env SQLA_JOBS_METRICS_PORT; default: off)",
    )
    parser.add_argument(
        "--metrics-host",
        default=env("METRICS_HOST", "127.0.0.1"),
        help="address the metrics port binds (env SQLA_JOBS_METRICS_HOST; default 127.0.0.1, "
        "this machine only; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=number("METRICS_INTERVAL", float, 15.0),
        help="seconds between samples of the queues' depth, taken by one worker at a time; 0: "
        "this worker never samples (env SQLA_JOBS_METRICS_INTERVAL; default 15)",
    )


def metrics_option(args: argparse.Namespace) -> Metrics | None:
    """The worker's :class:`~sqla_jobs.metrics.Metrics`, or None without ``--metrics-port``."""
    if args.metrics_port is None:
        return None
    try:
        from sqla_jobs.observe.metrics import Metrics
    except ImportError as exc:
        raise CLIError(
            f"--metrics-port needs prometheus-client ({exc}): pip install 'sqla-jobs[metrics]'"
        ) from None
    return Metrics(
        port=args.metrics_port,
        host=args.metrics_host,
        sample_interval=args.metrics_interval or None,
    )


def cmd_workers(args: argparse.Namespace) -> int:
    url = prepared_url(args)
    schema = getattr(args, "schema", None)
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    options = {} if schema is None else {"schema_translate_map": {None: schema}}
    try:
        with engine.connect() as conn:
            rows = conn.execution_options(**options).execute(workers_sql.list_workers()).all()
    except ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) != "42P01":  # undefined_table
            raise
        raise NotMigratedError(
            "no table sqla_jobs_worker: the database predates the registry of workers",
            f"to create it, {_migrate(schema)}",
        ) from None
    finally:
        engine.dispose()
    text = render(rows, as_json=args.json)
    if text:
        print(text)
    return EXIT_OK


def render(rows: Sequence[Any], *, as_json: bool) -> str:
    """The registered workers as a table, or as JSON lines."""
    if as_json:
        return "\n".join(
            json.dumps(
                {
                    c: v.isoformat() if isinstance(v, datetime) else v
                    for c, v in zip(COLUMNS, _values(r), strict=True)
                }
            )
            for r in rows
        )
    if not rows:
        return "(no workers)"
    lines = [
        f"{'name':<28} {'host':<16} {'pid':>7}  {'queues':<20} {'conc':>4}  "
        f"{'started (UTC)':<19}  heartbeat"
    ]
    for r in rows:
        beat = f"{r.heartbeat_age:.1f}s ago" + (" (stale)" if r.stale else "")
        lines.append(
            f"{r.name:<28} {r.host:<16} {r.pid:>7}  {','.join(r.queues):<20} {r.concurrency:>4}  "
            f"{r.started_at.strftime('%Y-%m-%d %H:%M:%S'):<19}  {beat}"
        )
    return "\n".join(lines)


def _values(row: Any) -> tuple[Any, ...]:
    return (*row[:7], round(float(row.heartbeat_age), 3), bool(row.stale))


def register(sub: Any, epilog: str) -> None:
    """Add ``workers`` to the ``sqla-jobs`` sub-commands ``sub``."""
    p = sub.add_parser(
        "workers",
        help="the live workers: name, host, pid, queues, concurrency, start, last heartbeat",
        epilog=epilog,
    )
    add_database_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object per worker, one per line")
    p.set_defaults(func=cmd_workers)
