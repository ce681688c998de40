"""The transaction the keyed claim runs in: JIT compilation off.

``psycopg``'s ``conn.transaction()`` sends a lone ``BEGIN``; this sends
:data:`~sqla_jobs.sql.claim.BEGIN_WITHOUT_JIT` in its place, in the same round trip. (A pipeline
would save that round trip, but on a transaction this small psycopg's async pipeline costs more
client CPU than the round trip it saves.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import psycopg

from sqla_jobs.db.connections import AsyncConn
from sqla_jobs.sql.claim import BEGIN_WITHOUT_JIT

__all__ = ["claim_transaction"]


@contextlib.asynccontextmanager
async def claim_transaction(conn: AsyncConn) -> AsyncIterator[None]:
    """A transaction on the autocommit ``conn``, JIT off: committed when the block ends, rolled
    back when it raises (the block's error is the one raised)."""
    await conn.execute(BEGIN_WITHOUT_JIT)
    try:
        yield
    except BaseException:
        # A lost connection cannot roll back, and need not: the server ends the transaction.
        with contextlib.suppress(psycopg.Error):
            await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")
