"""The query parameters of an application's database URL, for whichever PostgreSQL driver it names,
as the libpq parameters psycopg 3 connects with.

sqla-jobs connects with psycopg 3 whatever driver the application's own URL names (it never
imports that driver), so the URL's query must say in libpq's words what it says in the driver's.
Each parameter is translated, dropped or refused:

- the libpq parameters (``sslmode``, ``application_name``, ``options``, ...) pass unchanged: they
  are what psycopg2 and psycopg take anyway;
- a driver's own way of saying where or how securely to connect is translated (asyncpg's
  ``ssl=require`` is ``sslmode=require``, pg8000's ``unix_sock`` is ``host`` and ``port``);
- a driver's own tuning of its client side (asyncpg's statement cache and per-statement timeout,
  pg8000's socket timeout) is dropped: it says nothing about where or how securely to connect, and
  the worker sets its own timeouts and keepalives;
- anything else is refused with :class:`DatabaseURLError` naming the parameter (never its value,
  which may be a secret): guessing could connect somewhere else, or less securely, than the
  application does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath

from psycopg import pq

from sqla_jobs.errors import DatabaseURLError

Query = Mapping[str, str | tuple[str, ...]]

#: asyncpg's ``ssl`` as a string is one of libpq's sslmode values (anything else fails there too).
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: The URL parameters that may repeat: SQLAlchemy's multi-host form, ``?host=a:5432&host=b:5432``.
_REPEATABLE = frozenset({"host", "port"})


def _asyncpg_ssl(value: str) -> dict[str, str]:
    # asyncpg also takes verify_ca and verify_full (it looks the mode up as a Python name).
    mode = value.replace("_", "-")
    if mode not in _SSL_MODES:
        raise DatabaseURLError(
            f"database URL parameter ssl={value!r} (asyncpg): sqla-jobs connects through libpq "
            f"and needs one of {', '.join(_SSL_MODES)} (as sslmode)"
        )
    return {"sslmode": mode}


def _asyncpg_timeout(value: str) -> dict[str, str]:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise DatabaseURLError(
            f"database URL parameter timeout={value!r} (asyncpg): expected a number of seconds"
        )
    # libpq's connect_timeout is whole seconds: round up, so a timeout is never made shorter.
    return {"connect_timeout": str(math.ceil(seconds))}


def _pg8000_unix_sock(value: str) -> dict[str, str]:
    # libpq names a socket by its directory and port: <dir>/.s.PGSQL.<port>.
    path = PurePosixPath(value)
    prefix, _, port = path.name.rpartition(".")
    if prefix != ".s.PGSQL" or not port.isdigit():
        raise DatabaseURLError(
            f"database URL parameter unix_sock={value!r} (pg8000): libpq needs a socket named "
            "<directory>/.s.PGSQL.<port>; give host=<directory>&port=<port> instead"
        )
    return {"host": str(path.parent), "port": port}


Translate = Callable[[str], dict[str, str]]

#: By driver: the parameters translated into libpq's, and those dropped.
_TRANSLATED: dict[str, dict[str, Translate]] = {
    "asyncpg": {"ssl": _asyncpg_ssl, "timeout": _asyncpg_timeout},
    "pg8000": {"unix_sock": _pg8000_unix_sock},
}
_DROPPED: dict[str, frozenset[str]] = {
    "asyncpg": frozenset(
        {
            "prepared_statement_cache_size",
            "statement_cache_size",
            "max_cached_statement_lifetime",
            "max_cacheable_statement_size",
            "command_timeout",
        }
    ),
    "pg8000": frozenset({"timeout", "tcp_keepalive"}),
}
#: The drivers whose URLs are taken; "" is SQLAlchemy's default for postgresql:// (psycopg2).
DRIVERS = frozenset(
    {"", "psycopg", "psycopg_async", "psycopg2", "psycopg2cffi", "asyncpg", "pg8000"}
)


@functools.cache
def libpq_parameters() -> frozenset[str]:
    """The connection parameters the libpq psycopg runs on accepts (asked of that libpq, so a
    parameter of a newer libpq is taken where it works)."""
    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


def to_libpq(driver: str, query: Query) -> dict[str, str | tuple[str, ...]]:
    """``query``, the query of a URL naming ``driver`` (``""`` for none), in libpq's parameters;
    :class:`DatabaseURLError` names the first parameter that cannot be translated."""
    translated = _TRANSLATED.get(driver, {})
    dropped = _DROPPED.get(driver, frozenset())
    known = libpq_parameters()
    out: dict[str, str | tuple[str, ...]] = {}
    for name, value in query.items():
        if isinstance(value, tuple) and name not in _REPEATABLE:
            raise DatabaseURLError(f"database URL parameter {name!r} is given more than once")
        if name in dropped:
            continue
        if name in translated:
            assert isinstance(value, str)
            for key, new in translated[name](value).items():
                if key in query or key in out:
                    raise DatabaseURLError(
                        f"database URL parameters {name!r} and {key!r} say the same thing: "
                        "keep one of them"
                    )
                out[key] = new
            continue
        if name not in known:
            via = f" of the {driver} driver" if driver else ""
            raise DatabaseURLError(
                f"database URL parameter {name!r}{via} has no libpq equivalent, and sqla-jobs "
                "connects through libpq (psycopg 3): remove it from the URL sqla-jobs is given"
            )
        out[name] = value
    return out
