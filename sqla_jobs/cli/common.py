"""What every ``sqla-jobs`` command shares: the one-line error, the exit codes, the database URL,
and the checks a command runs before it touches the queue table.

A module of its own so that the command modules (``ops``, ``listings``) and ``entry`` all
import downward from here, never from each other.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import psycopg

from sqla_jobs.db.preflight import check_job_table
from sqla_jobs.db.urls import (
    ENV_VAR,
    hosts_without_primary,
    libpq_conninfo,
    redact,
    with_session_attrs,
)
from sqla_jobs.jobs import Jobs
from sqla_jobs.kinds import check_name

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_MIGRATED = 4
EXIT_STUCK = 5
#: The jobs named do not exist, or are in a state the command does not apply to: nothing changed.
EXIT_NOT_APPLICABLE = 6
EXIT_FORCED = 130


class CLIError(Exception):
    """A one-line error for the user, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


#: A reStructuredText role, such as ``:class:`~sqla_jobs.Jobs```.
_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain_text(rst: str) -> str:
    """Docstring prose (reStructuredText) as the plain text of ``--help``: a role and a literal
    keep only their text, so ``:class:`~sqla_jobs.Jobs``` reads sqla_jobs.Jobs."""
    return _RST_ROLE.sub(r"\1", rst).replace("``", "")


def package_version() -> str:
    """The installed distribution's version (what ``sqla-jobs --version`` prints)."""
    try:
        return version("sqla-jobs")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def env(name: str, default: str | None = None) -> str | None:
    """``SQLA_JOBS_<name>`` from the environment."""
    return os.environ.get(f"SQLA_JOBS_{name}", default)


def env_off(name: str) -> bool:
    """Whether ``SQLA_JOBS_<name>`` turns a feature off (``0``, ``false`` or ``no``): the default
    of a ``--no-...`` flag."""
    return (env(name) or "1").lower() in ("0", "false", "no")


def database_url(args: argparse.Namespace) -> str:
    """``--database-url``, else ``$DATABASE_URL``; a usage error without either."""
    url: str | None = getattr(args, "database_url", None) or os.environ.get(ENV_VAR)
    if not url:
        raise CLIError(f"no database: set {ENV_VAR} or pass --database-url")
    warning = hosts_without_primary(url)
    # The worker and the dashboard log it themselves, as an application's Worker and app do.
    if warning is not None and getattr(args, "command", None) not in ("worker", "dashboard"):
        print(f"sqla-jobs: warning: {warning}", file=sys.stderr)
    return url


def check_reachable(url: str, what: str = "the database") -> None:
    """Connect once, so an unreachable database is a one-line error rather than a traceback."""
    try:
        with psycopg.connect(libpq_conninfo(url), connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CLIError(f"cannot reach {what} at {redact(url)}: {first}", EXIT_UNREACHABLE) from None


def check_answers(url: str) -> str:
    """:func:`check_reachable` for a worker, which waits for a primary: a server of ``url`` that
    answers but takes no writes (a standby, a primary turned read-only) passes too. The URL to
    read the catalog from: ``url``, or any server of it that answers (a standby has the tables)."""
    try:
        check_reachable(url)
        return url
    except CLIError as exc:
        if exc.code != EXIT_UNREACHABLE:
            raise
        try:
            conninfo = libpq_conninfo(url)
            with psycopg.connect(conninfo, connect_timeout=5, target_session_attrs="any"):
                pass
        except psycopg.OperationalError:
            raise exc from None
        return with_session_attrs(url, "any")


def schema_hint(schema: str) -> str:
    """How a command that takes ``--schema`` points at the schema holding the queue table."""
    return f"run with --schema {schema} (or SQLA_JOBS_SCHEMA={schema})"


def prepared_url(args: argparse.Namespace) -> str:
    """The database URL of a command with ``--database-url`` and ``--schema``, once the database
    answers and holds a queue table as new as this version needs (else a one-line error)."""
    url = database_url(args)
    check_reachable(url)
    check_job_table(url, getattr(args, "schema", None), schema_hint)
    return url


def add_database_options(
    parser: argparse.ArgumentParser, *, suppress: bool = False, schema: bool = True
) -> None:
    """``--database-url`` and ``--schema``. ``suppress``: on a nested sub-command, so that its
    unset options do not overwrite what was given before the sub-command's name."""
    default: object = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--database-url",
        default=default,
        help=f"PostgreSQL URL, for any driver: postgresql://, postgresql+asyncpg://, ... (default: ${ENV_VAR})",
    )
    if schema:
        parser.add_argument(
            "--schema",
            default=argparse.SUPPRESS if suppress else env("SCHEMA"),
            help="schema of the queue table (env SQLA_JOBS_SCHEMA; default: the search_path)",
        )


def checked_name(what: str, value: str | None) -> str | None:
    """A queue or kind name from the command line, or None; a usage error if it is invalid."""
    if value is None:
        return None
    try:
        return check_name(what, value)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def load_jobs(target: str) -> Jobs:
    """Import ``MODULE:ATTR`` and return the :class:`Jobs` found there (the current directory is on
    the import path, as for ``python -m``)."""
    obj = load_object(target)
    if not isinstance(obj, Jobs):
        raise CLIError(f"{target} is a {type(obj).__qualname__}, not a sqla_jobs.Jobs")
    return obj


def load_sessionmaker(target: str) -> Any:
    """Import ``MODULE:ATTR``: the application's sessionmaker, async_sessionmaker or engine,
    for the handlers that take a Session."""
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
    from sqlalchemy.orm import sessionmaker

    obj = load_object(target)
    if not isinstance(obj, (sessionmaker, async_sessionmaker, Engine, AsyncEngine)):
        raise CLIError(
            f"--sessionmaker {target} is a {type(obj).__qualname__}, not a sessionmaker, "
            "async_sessionmaker, Engine or AsyncEngine"
        )
    return obj


def load_object(target: str) -> Any:
    """Import ``MODULE:ATTR`` (dotted attributes allowed) and return it."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"expected MODULE:ATTR (e.g. myapp.tasks:jobs), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CLIError(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:
        # The application's own import failed (a missing setting, a bad config): one line, as for
        # every other bad target; the traceback is the user's to ask for.
        if os.environ.get("SQLA_JOBS_DEBUG") == "1":
            raise CLIError(f"importing module {module_name!r} failed") from exc
        first = (str(exc).strip().splitlines() or ["(no message)"])[0]
        raise CLIError(
            f"importing module {module_name!r} raised {type(exc).__name__}: {first} "
            "(SQLA_JOBS_DEBUG=1 shows the traceback)"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj
