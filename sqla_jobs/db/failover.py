"""Which errors mean "this server is no longer the primary, or the connection is gone", and the
one-line helper that makes an application's engine treat them as disconnects.

A failover shows itself in several ways, and PostgreSQL gives them different SQLSTATEs: the old
primary's sessions are terminated (57P01 admin_shutdown, 57P02 crash_shutdown) or simply dropped;
a demoted or starting server refuses writes (25006 read_only_sql_transaction: "cannot execute
INSERT in a read-only transaction", "cannot execute LISTEN during recovery"), read-write mode
("cannot set transaction read-write mode during recovery", 0A000) and new sessions (57P03
cannot_connect_now: "the database system is starting up"); libpq reports a refused or reset
connection without any SQLSTATE. Every one of them is cured the same way: drop the connection and
open a new one, which ``target_session_attrs=read-write`` sends to whichever host is the primary
now. Errors a retry on the same connection may cure (a deadlock, a lock timeout, a cancelled
statement) are not in this class.
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine, ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["caused_by_lost", "failover_safe", "is_lost", "is_lost_state"]

AnyEngine = TypeVar("AnyEngine", Engine, AsyncEngine)

#: SQLSTATEs that mean the session is gone or sits on a server that is not (or no longer) the
#: primary: class 08 (connection exception) is matched by its prefix.
LOST_SQLSTATES = frozenset(
    {
        "25006",  # read_only_sql_transaction: a standby, or a primary turned read-only
        "57P01",  # admin_shutdown: the server shuts down, or the session was terminated
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: starting up, shutting down, in recovery
        "57P05",  # idle_session_timeout: the server closed the session
        "25P03",  # idle_in_transaction_session_timeout: the server closed the session
    }
)
#: What PostgreSQL says when recovery refuses something under a SQLSTATE shared with other
#: errors (0A000 "cannot set transaction read-write mode during recovery", 55000 "recovery is
#: in progress", "cannot acquire lock mode ... while recovery is in progress").
_RECOVERY_WORDS = ("during recovery", "recovery is in progress")


def is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (a psycopg error, or SQLAlchemy's wrapper of one) means the connection is
    gone or its server is not the primary: drop the connection and open a new one."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate is None:
        # libpq's own errors: refused, reset, closed, a failed connection attempt (a pipeline
        # aborted by an earlier statement's error is that error's business, not a loss).
        if isinstance(exc, psycopg.errors.PipelineAborted):
            return False
        return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
    return is_lost_state(exc.sqlstate, str(exc))


def is_lost_state(sqlstate: str, message: str) -> bool:
    """:func:`is_lost` for an error known by its SQLSTATE and message only (a raw libpq result)."""
    if sqlstate in LOST_SQLSTATES or sqlstate.startswith("08"):
        return True
    lowered = message.lower()
    return any(words in lowered for words in _RECOVERY_WORDS)


def caused_by_lost(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from (its ``__cause__`` or ``__context__``
    chain) :func:`is_lost`: a handler that met the failover and raised an error of its own."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if is_lost(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def failover_safe(engine: AnyEngine) -> AnyEngine:
    """Make ``engine`` treat "this server is no longer the primary" as a disconnect; returns it.

    SQLAlchemy counts a terminated or refused connection as a disconnect already, but not a
    read-only transaction (SQLSTATE 25006) or "recovery in progress": after a switchover the
    pool would keep its connections to the demoted server, and ``pool_pre_ping``'s ``SELECT 1``
    succeeds there. With this helper (a ``handle_error`` listener) such an error invalidates the
    connection and the pool's other connections, so the next checkout connects again, to
    whichever host of a multi-host URL with ``target_session_attrs=read-write`` is the primary
    now. The statement that met the error still raises it (its transaction is lost); nothing is
    retried. Works on sync and async engines; calling it twice adds one listener.
    """
    target = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    if not event.contains(target, "handle_error", _mark_disconnect):
        event.listen(target, "handle_error", _mark_disconnect)
    return engine


def _mark_disconnect(context: ExceptionContext) -> Any:
    if not context.is_disconnect and is_lost(context.original_exception):
        context.is_disconnect = True
    return None
