"""Database URLs: parsed for any PostgreSQL driver, turned into what an engine or a raw psycopg
connection takes, pointed at another database, redacted for logs.

(The repository's demo, benchmarks and tests fall back on an embedded server through ``devdb``, at
the repository's top level: nothing on the library's runtime path starts one.)
"""

from __future__ import annotations

from typing import Any

from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from sqla_jobs.db import url_params as _url_params
from sqla_jobs.errors import DatabaseURLError

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
    (:mod:`sqla_jobs.db.url_params`); :class:`DatabaseURLError` names what is wrong."""
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


#: The ``target_session_attrs`` that make libpq pick, among several hosts, the one that takes writes.
_PRIMARY_ATTRS = ("read-write", "primary")


def hosts_without_primary(url: str) -> str | None:
    """A warning when ``url`` names several hosts without ``target_session_attrs=read-write``
    (or ``primary``); None otherwise.

    libpq then connects to the first host that answers, which after a failover may be the old
    primary, now a standby that refuses every write: the worker would wait there (saying so)
    instead of following the new primary. A warning, not a refusal: several hosts in front of
    one primary (poolers, say) are a sound setup."""
    query = parse_url(url).query
    hosts = query.get("host")
    if hosts is None:
        return None
    listed = list(hosts) if isinstance(hosts, tuple) else [hosts]
    count = sum(len([h for h in each.split(",") if h]) for each in listed)
    attrs = query.get("target_session_attrs")
    if count < 2 or attrs in _PRIMARY_ATTRS:
        return None
    return (
        f"the database URL names {count} hosts without target_session_attrs=read-write: "
        "sqla-jobs connects to the first that answers, which after a failover may be a standby "
        "that refuses every write; add &target_session_attrs=read-write to the URL (or primary)"
    )


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


def with_session_attrs(url: str, attrs: str) -> str:
    """``url`` with ``target_session_attrs=attrs`` (``any``: whichever of its hosts answers)."""
    parsed = parse_url(url)
    query = {**parsed.query, "target_session_attrs": attrs}
    return parsed.set(query=query).render_as_string(hide_password=False)


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
