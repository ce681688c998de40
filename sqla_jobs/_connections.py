"""What every long-lived worker connection shares: which errors mean "reconnect", how long to
wait before trying again, and closing a connection that may already be broken."""

from __future__ import annotations

import psycopg

#: Errors that mean "the connection is gone": reconnect, never crash.
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


def reconnect_delay(failures: int, first: float = 0.1, cap: float = 5.0) -> float:
    """Seconds to wait after the ``failures``-th consecutive failure: doubling from ``2 * first``,
    capped, so a database that is down costs a bounded number of attempts, not a busy loop."""
    return min(first * float(2 ** min(failures, 32)), cap)


def close_quietly(conn: psycopg.Connection[tuple[object, ...]] | None) -> None:
    """Close ``conn`` if there is one; a broken connection has nothing left to report."""
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


async def aclose_quietly(conn: psycopg.AsyncConnection[tuple[object, ...]] | None) -> None:
    """:func:`close_quietly` for an async connection."""
    if conn is not None:
        try:
            await conn.close()
        except Exception:
            pass
