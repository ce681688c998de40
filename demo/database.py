"""Where the story runs: a database created for it on the server, and dropped at the end.

The server is ``--database-url``, else ``DATABASE_URL``, else an embedded PostgreSQL started for
the run (:mod:`devdb`). The database is new (``sqla_jobs_demo_<random>``), so the demo never
touches existing data, and its drop is registered before anything else can fail, so an error or a
Ctrl-C still removes it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
from collections.abc import Iterator

import psycopg
from psycopg import sql

from devdb import ENV_VAR, embedded_server
from sqla_jobs.db.urls import libpq_conninfo, redact, with_database

from .console import Console

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130


class ServerUnusable(Exception):
    """The database server cannot be reached, or will not let the demo create its database."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def sigint_deferred(*, reraise: bool) -> Iterator[None]:
    """Hold Ctrl-C back while something must not be cut in half (starting the embedded server,
    creating the database and registering its drop, cleaning up); then, with ``reraise``, act on it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and reraise:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _embedded(console: Console) -> Iterator[str]:
    started = False
    try:
        with embedded_server() as url:
            started = True
            yield url
    finally:
        if started:
            console.say("stopped the embedded PostgreSQL and deleted its data directory", indent=0)


def server(console: Console, stack: contextlib.ExitStack, database_url: str | None) -> str:
    """The URL of the server to run on; an embedded one is stopped when ``stack`` closes."""
    url = database_url or os.environ.get(ENV_VAR)
    if url:
        source = "--database-url" if database_url else ENV_VAR
        console.say(f"server: {redact(url)} (from {source})")
        return url
    console.say(f"{ENV_VAR} is not set: starting an embedded PostgreSQL (a pip wheel) ...")
    # A Ctrl-C in the middle of the server's start would leave it running: let it finish first.
    with sigint_deferred(reraise=True):
        url = stack.enter_context(_embedded(console))
    console.say(f"server: {redact(url)} (embedded, stopped at the end)")
    return url


def create_database(console: Console, stack: contextlib.ExitStack, server_url: str) -> str:
    """Create the demo's database on the server; its URL. Dropped when ``stack`` closes, whoever
    is still connected to it. :class:`ServerUnusable` when that cannot be done."""
    name = f"sqla_jobs_demo_{secrets.token_hex(4)}"
    conninfo = libpq_conninfo(server_url)
    try:
        admin = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ServerUnusable(
            f"cannot reach the database at {redact(server_url)}: {first}", EXIT_UNREACHABLE
        ) from None

    def drop() -> None:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        console.say(f"dropped the demo database {name}", indent=0)

    with admin, sigint_deferred(reraise=True):
        version = admin.execute("SHOW server_version").fetchone()
        try:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            raise ServerUnusable(
                f"the demo creates (and then drops) a database of its own, and the user of "
                f"{redact(server_url)} may not create databases: use a role with CREATEDB, or "
                f"unset {ENV_VAR} to run on an embedded PostgreSQL",
                EXIT_USAGE,
            ) from None
        stack.callback(drop)
    console.say(f"PostgreSQL {version[0] if version else '?'}")
    console.say(
        f"created the throw-away database {name}; it is dropped at the end whatever happens, "
        "so the demo never touches your data"
    )
    return with_database(server_url, name)
