"""What the commands that only read (``stats``, ``jobs list``, ``jobs show``, ``queues``) share:
``--read-url`` (env ``SQLA_JOBS_READ_URL``), a replica to read from instead of the database URL,
and one read transaction that a replica's recovery may cancel once.

Only these commands take it: every command that changes something (``jobs retry``, ``queues
pause``, ...) writes on the database URL, whatever the environment says.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs.cli.common import (
    EXIT_ERROR,
    CLIError,
    check_reachable,
    env,
    prepared_url,
    schema_hint,
)
from sqla_jobs.db.preflight import check_job_table
from sqla_jobs.db.replica import ReplicaConflictError, retrying_conflicts
from sqla_jobs.db.urls import redact, sqlalchemy_url
from sqla_jobs.jobs import Jobs

T = TypeVar("T")

#: How errors name the read URL.
READ_OPTION = "--read-url or SQLA_JOBS_READ_URL"


def read_url(args: argparse.Namespace) -> str | None:
    """``--read-url``, else ``$SQLA_JOBS_READ_URL``: the replica a listing reads from (None: it
    reads from the database URL)."""
    return getattr(args, "read_url", None) or env("READ_URL") or None


def reading_url(args: argparse.Namespace) -> str:
    """The URL a read-only command reads from, once it answers and holds a queue table: the
    read URL when there is one (else the database URL), or a one-line error."""
    replica = read_url(args)
    if replica is None:
        return prepared_url(args)
    check_reachable(replica, f"the read replica ({READ_OPTION})")
    check_job_table(replica, getattr(args, "schema", None), schema_hint)
    return replica


def add_read_option(parser: argparse.ArgumentParser) -> None:
    """``--read-url``: the replica of a command that only reads (``stats``, ``jobs list``, ...)."""
    parser.add_argument(
        "--read-url",
        default=None,
        help="read from this replica (a hot standby of the database) instead of the database "
        "URL; a URL of the primary works too (env SQLA_JOBS_READ_URL)",
    )


def read(args: argparse.Namespace, fn: Callable[[Jobs, Session], T]) -> T:
    """``fn(jobs, session)`` in one read-only transaction on the read URL (else the database URL);
    run once more if a replica's recovery cancels it, then a one-line error."""
    jobs = Jobs(schema=getattr(args, "schema", None))
    url = reading_url(args)
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)

    def once() -> T:
        with Session(engine) as session, session.begin():
            return fn(jobs, session)

    try:
        return retrying_conflicts(once, f"the server at {redact(url)}")
    except ReplicaConflictError as exc:
        raise CLIError(str(exc), EXIT_ERROR) from None
    finally:
        engine.dispose()
