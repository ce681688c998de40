"""The ``sqla-jobs`` command: ``worker``, ``stats``, ``jobs``, ``queues``, ``workers``,
``rate-limits``, ``migrate``, ``prune`` and ``dashboard``. (The guided demo is not a command of the package: it lives in the
repository, ``nox -s demo``.)

Exit codes: 0 success (a worker stopped gracefully); 1 an unexpected error; 2 bad usage or
configuration (including a bad ``MODULE:ATTR``, a bad filter or queue name, a bad log level or log
config); 3 the database cannot be reached; 4 the database is not migrated (no queue table where the
command looks, or an older one); 5 a worker stopped because a sync handler was stuck past its
timeout and grace (restart it); 6 a job named does not exist or is in a state the command does not
apply to (nothing changed); 130 a worker forced out by a second SIGTERM/SIGINT.

An unexpected database error is one line on stderr; SQLA_JOBS_DEBUG=1 shows its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TypeVar

import psycopg
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from sqla_jobs.cli import dashboard as _cli_dashboard
from sqla_jobs.cli import migrate as _cli_migrate
from sqla_jobs.cli import ops as _cli_ops
from sqla_jobs.cli import rate_limits as _cli_rate_limits
from sqla_jobs.cli import schedules as _cli_schedules
from sqla_jobs.cli import workers as _cli_workers
from sqla_jobs.cli.common import (
    EXIT_ERROR,
    EXIT_FORCED,
    EXIT_NOT_APPLICABLE,
    EXIT_NOT_MIGRATED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CLIError,
    add_database_options,
    check_answers,
    check_reachable,
    database_url,
    env,
    env_off,
    load_jobs,
    load_sessionmaker,
    package_version,
    plain_text,
    prepared_url,
)
from sqla_jobs.cli.prune import add_prune_command, add_retention_flags, retention_options
from sqla_jobs.cli.reads import add_read_option, read_url, reading_url
from sqla_jobs.db.preflight import check_job_table
from sqla_jobs.db.replica import ReplicaConflictError
from sqla_jobs.db.urls import ENV_VAR
from sqla_jobs.errors import (
    ConfigurationError,
    JobNotFoundError,
    JobStateError,
    NotMigratedError,
    ScheduleNotFoundError,
    SqlaJobsError,
    UniqueKeyTakenError,
)
from sqla_jobs.worker import prefetch as _prefetch

T = TypeVar("T", int, float)

DESCRIPTION = (
    "A Postgres job queue in one table: run its workers; list, retry and cancel its jobs; pause "
    "its queues; run its periodic schedules; create or upgrade its tables."
)


def cmd_worker(args: argparse.Namespace) -> int:
    from sqla_jobs.cli import logfmt as _logging
    from sqla_jobs.worker.facade import Worker
    from sqla_jobs.worker.heap import tune_worker_heap

    try:
        _logging.configure(args.log_level, args.log_format, args.log_config)
    except _logging.LoggingSetupError as exc:
        raise CLIError(str(exc)) from None
    jobs = load_jobs(args.target)
    url = database_url(args)
    queues = [q for q in (args.queues or "").split(",") if q] or None
    worker = Worker(
        jobs,
        url,
        queues=queues,
        concurrency=args.concurrency,
        lease=args.lease,
        heartbeat=args.heartbeat,
        poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout,
        stuck_grace=args.stuck_grace,
        reap_interval=args.reap_interval,
        listen=not args.no_listen,
        keep_history=args.keep_history,
        prefetch=args.prefetch,
        prepared_statements=not args.no_prepared_statements,
        schedules=not args.no_schedules,
        throughput=not args.no_throughput,
        sessionmaker=load_sessionmaker(args.sessionmaker) if args.sessionmaker else None,
        metrics=_cli_workers.metrics_option(args),
        **retention_options(args),
    )
    # A server that answers but takes no writes (a standby) passes: the worker waits for a
    # primary. Before run_sync: a missing table must stop the worker before it starts any thread.
    catalog = check_answers(url)
    check_job_table(
        catalog, jobs.schema, lambda schema: f"set Jobs(schema={schema!r}) in {args.target}"
    )
    # This process runs the worker and nothing else: tune its garbage collector for it.
    tune_worker_heap()
    return worker.run_sync()


def cmd_stats(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from sqla_jobs.observe.stats import collect, render, render_json

    old = None if args.old_transaction is None else timedelta(seconds=args.old_transaction)
    replica = read_url(args)
    if replica is None:
        stats = collect(prepared_url(args), schema=args.schema, old_transaction=old)
    else:
        # The counts from the replica; the table's health and the oldest transaction from the
        # primary when its URL is known, since they describe the server they are read on.
        primary = getattr(args, "database_url", None) or os.environ.get(ENV_VAR)
        if primary is not None:
            try:
                check_reachable(primary)
            except CLIError as exc:
                if exc.code != EXIT_UNREACHABLE:
                    raise
                # A replica is what an operator reaches for when the primary is down.
                print(f"sqla-jobs: warning: {exc}; reading the replica alone", file=sys.stderr)
                primary = None
        try:
            stats = collect(
                primary,
                schema=args.schema,
                old_transaction=old,
                read_url=reading_url(args),
            )
        except ReplicaConflictError as exc:
            raise CLIError(str(exc), EXIT_ERROR) from None
    print(render_json(stats) if args.json else render(stats))
    return EXIT_OK


def _numberenv(name: str, kind: type[T], default: T | None) -> T | None:
    """``SQLA_JOBS_<name>`` as an int or float; a clear usage error if it is not one."""
    raw = env(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise CLIError(f"SQLA_JOBS_{name} must be a number, got {raw!r}") from None


def build_parser() -> argparse.ArgumentParser:
    # --help is plain text: the docstring's reStructuredText markup is unwrapped.
    epilog = plain_text("\n\n".join(__doc__.split("\n\n")[1:]))
    parser = argparse.ArgumentParser(prog="sqla-jobs", description=DESCRIPTION, epilog=epilog)
    parser.add_argument("--version", action="version", version=f"sqla-jobs {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def db(p: argparse.ArgumentParser) -> None:
        add_database_options(p, schema=False)

    w = sub.add_parser(
        "worker", help="run the handlers of MODULE:ATTR (a sqla_jobs.Jobs)", epilog=epilog
    )
    w.add_argument("target", metavar="MODULE:ATTR")
    db(w)
    w.add_argument(
        "--queues",
        default=env("QUEUES"),
        help="comma-separated queues (env SQLA_JOBS_QUEUES; default: the queues of the kinds "
        "that have handlers)",
    )
    w.add_argument(
        "--concurrency",
        type=int,
        default=_numberenv("CONCURRENCY", int, 4),
        help="handlers running at once (env SQLA_JOBS_CONCURRENCY; default 4)",
    )
    w.add_argument(
        "--lease",
        type=float,
        default=_numberenv("LEASE", float, 60.0),
        help="seconds a claim is held without a heartbeat (env SQLA_JOBS_LEASE; default 60)",
    )
    w.add_argument(
        "--heartbeat",
        type=float,
        default=_numberenv("HEARTBEAT", float, None),
        help="seconds between lease renewals (env SQLA_JOBS_HEARTBEAT; default lease/3)",
    )
    w.add_argument(
        "--poll-interval",
        type=float,
        default=_numberenv("POLL_INTERVAL", float, 1.0),
        help="seconds between polls when no NOTIFY arrives (env SQLA_JOBS_POLL_INTERVAL; default 1)",
    )
    w.add_argument(
        "--shutdown-timeout",
        type=float,
        default=_numberenv("SHUTDOWN_TIMEOUT", float, 30.0),
        help="seconds running jobs get to finish after SIGTERM (env SQLA_JOBS_SHUTDOWN_TIMEOUT; 30)",
    )
    w.add_argument(
        "--stuck-grace",
        type=float,
        default=_numberenv("STUCK_GRACE", float, 60.0),
        help="seconds a sync handler may run past its kind's timeout before the worker stops and "
        "exits with code 5 for a restart (env SQLA_JOBS_STUCK_GRACE; 60)",
    )
    w.add_argument(
        "--reap-interval",
        type=float,
        default=_numberenv("REAP_INTERVAL", float, None),
        help="seconds between reaps of expired leases (env SQLA_JOBS_REAP_INTERVAL; "
        "half the lease, at most 30)",
    )
    w.add_argument(
        "--no-listen",
        action="store_true",
        default=env_off("LISTEN"),
        help="poll only, no LISTEN (PgBouncer transaction pooling; env SQLA_JOBS_LISTEN=0)",
    )
    w.add_argument(
        "--sessionmaker",
        metavar="MODULE:ATTR",
        default=env("SESSIONMAKER"),
        help="the application's sessionmaker (or async_sessionmaker, or engine) for handlers that "
        "take a Session; default: one on the worker's database URL (env SQLA_JOBS_SESSIONMAKER)",
    )
    w.add_argument(
        "--no-schedules",
        action="store_true",
        default=env_off("SCHEDULES"),
        help="do not enqueue the ticks of the application's periodic schedules (env "
        "SQLA_JOBS_SCHEDULES=0)",
    )
    w.add_argument(
        "--no-throughput",
        action="store_true",
        default=env_off("THROUGHPUT"),
        help="do not add this worker's per-minute counts to sqla_jobs_throughput, the "
        "dashboard's chart (env SQLA_JOBS_THROUGHPUT=0)",
    )
    w.add_argument(
        "--no-prepared-statements",
        action="store_true",
        default=env_off("PREPARED_STATEMENTS"),
        help="never prepare statements server-side (PgBouncer < 1.21 in transaction pooling; "
        "env SQLA_JOBS_PREPARED_STATEMENTS=0)",
    )
    w.add_argument(
        "--prefetch",
        type=int,
        default=_numberenv("PREFETCH", int, None),
        help="claimed jobs that may wait for a free slot; 0: none (env SQLA_JOBS_PREFETCH; "
        f"default: automatic, what the slots finish in about {_prefetch.HORIZON:g} s at the "
        f"handlers' average run time, at most {_prefetch.CAP}; none before the first jobs "
        f"finish, nor while handlers average over {_prefetch.SHORT_JOB * 1000:g} ms)",
    )
    w.add_argument(
        "--keep-history",
        action="store_true",
        default=(env("KEEP_HISTORY", "0") or "0").lower() in ("1", "true", "yes"),
        help="move each completed job into sqla_jobs_history instead of deleting it "
        "(env SQLA_JOBS_KEEP_HISTORY=1)",
    )
    add_retention_flags(w)
    _cli_workers.add_metrics_flags(w, _numberenv)
    w.add_argument(
        "--log-level",
        default=env("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (env SQLA_JOBS_LOG_LEVEL; default INFO)",
    )
    w.add_argument(
        "--log-format",
        default=env("LOG_FORMAT", "logfmt"),
        help="logfmt or json: one line per record, of every logger, the handlers' own included "
        "(env SQLA_JOBS_LOG_FORMAT; default logfmt)",
    )
    w.add_argument(
        "--log-config",
        metavar="FILE",
        default=env("LOG_CONFIG"),
        help="a logging.config.dictConfig in JSON (FILE.json) or TOML (FILE.toml, Python 3.11 "
        "or later), applied "
        "instead of --log-format and --log-level (env SQLA_JOBS_LOG_CONFIG)",
    )
    w.set_defaults(func=cmd_worker)

    s = sub.add_parser(
        "stats", help="jobs per queue and state, queue latency, table health", epilog=epilog
    )
    add_database_options(s)
    s.add_argument("--json", action="store_true", help="one JSON object, with a per-kind breakdown")
    add_read_option(s)
    s.add_argument(
        "--old-transaction",
        type=float,
        default=_numberenv("OLD_TRANSACTION", float, None),
        help="warn about a transaction open longer than this many seconds "
        "(env SQLA_JOBS_OLD_TRANSACTION; default 300)",
    )
    s.set_defaults(func=cmd_stats)

    _cli_ops.register(sub, epilog)
    _cli_schedules.register(sub, epilog)
    _cli_workers.register(sub, epilog)
    _cli_rate_limits.register(sub, epilog)
    _cli_dashboard.register(sub, epilog)

    _cli_migrate.register(sub, epilog)

    add_prune_command(sub, db, epilog, database_url, check_reachable)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sqla-jobs`` console script; returns the exit code."""
    try:
        parser = build_parser()
        args = parser.parse_args(_default_schedules_command(sys.argv[1:] if argv is None else argv))
        code: int = args.func(args)
        return code
    except NotMigratedError as exc:
        print(f"sqla-jobs: error: {exc.problem}", file=sys.stderr)
        print(f"sqla-jobs: {exc.fix}", file=sys.stderr)
        return EXIT_NOT_MIGRATED
    except CLIError as exc:
        if exc.__cause__ is not None and os.environ.get("SQLA_JOBS_DEBUG") == "1":
            traceback.print_exception(exc.__cause__)
        print(f"sqla-jobs: error: {exc}", file=sys.stderr)
        return exc.code
    except (JobNotFoundError, JobStateError, ScheduleNotFoundError, UniqueKeyTakenError) as exc:
        print(f"sqla-jobs: error: {exc}", file=sys.stderr)
        return EXIT_NOT_APPLICABLE
    except (ConfigurationError, SqlaJobsError) as exc:
        print(f"sqla-jobs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_FORCED
    except (psycopg.Error, SQLAlchemyError) as exc:
        if os.environ.get("SQLA_JOBS_DEBUG") == "1":
            raise
        print(f"sqla-jobs: error: {_database_error(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _default_schedules_command(argv: Sequence[str]) -> list[str]:
    """``sqla-jobs schedules APP`` is ``sqla-jobs schedules list APP``."""
    args = list(argv)
    if not args or args[0] != "schedules":
        return args
    # The first word that is neither an option nor an option's value: APP, or a subcommand.
    i = 1
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ("--database-url", "--schema") else 1
    if i < len(args) and args[i] not in ("list", "run", "pause", "resume"):
        args.insert(1, "list")
    return args


def _database_error(exc: psycopg.Error | SQLAlchemyError) -> str:
    """One line naming an unexpected database error (SQLAlchemy's wrapper unwrapped)."""
    cause: BaseException = exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc
    lines = str(cause).strip().splitlines()
    first = lines[0] if lines else "(no message)"
    return (
        f"database error ({type(cause).__name__}): {first} (SQLA_JOBS_DEBUG=1 shows the traceback)"
    )


if __name__ == "__main__":
    sys.exit(main())
