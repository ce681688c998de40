"""Reads sent to a replica: where a server stands in the write-ahead log, and a read retried once
when the replica's recovery cancels it.

A hot standby cancels a query whose snapshot or locks stand in the way of the WAL it replays
(a vacuum's cleanup, an ``ACCESS EXCLUSIVE`` lock) once ``max_standby_streaming_delay`` has
passed: SQLSTATE 40001, "canceling statement due to conflict with recovery". The same read run
again usually gets through; a second cancellation is reported, never retried in a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqla_jobs.errors import SqlaJobsError
from sqla_jobs.sql import replicas as replicas_sql

T = TypeVar("T")

_SERIALIZATION_FAILURE = "40001"


class ReplicaConflictError(SqlaJobsError):
    """The replica cancelled the same read twice to replay the primary's changes."""


@dataclass(frozen=True)
class Position:
    """Where a server stands: a standby (``standby``) at the WAL position it replayed, or a
    primary at its current write position; ``lsn`` None: a standby that replayed nothing yet."""

    standby: bool
    lsn: int | None

    def reached(self, mark: int) -> bool:
        """Whether this server has every change up to the primary's position ``mark``."""
        return self.lsn is not None and self.lsn >= mark


def lsn_number(text: str) -> int:
    """A WAL position as PostgreSQL prints it (``16/B374D848``) as one comparable number."""
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError(f"not a WAL position: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


def position(conn: Connection | Session) -> Position:
    """Where the server behind ``conn`` stands in the WAL (one statement, no lock, no table)."""
    row = conn.execute(replicas_sql.wal_position()).one()
    return Position(bool(row.in_recovery), None if row.lsn is None else lsn_number(row.lsn))


def is_recovery_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is a standby cancelling a query, or ending a session, to replay WAL."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(
        orig, "sqlstate", None
    ) == _SERIALIZATION_FAILURE and "conflict with recovery" in str(orig)


def retrying_conflicts(read: Callable[[], T], where: str) -> T:
    """``read()``, run once more if a recovery conflict cancelled it; a second conflict raises
    :class:`ReplicaConflictError`, naming ``where`` the read ran (``"the replica"``).

    ``read`` must open its own transaction: the cancelled one is gone, and the retry starts anew
    on a fresh snapshot (and, if the standby ended the session, on a new connection).
    """
    try:
        return read()
    except DBAPIError as exc:
        if not is_recovery_conflict(exc):
            raise
    try:
        return read()
    except DBAPIError as exc:
        if not is_recovery_conflict(exc):
            raise
        first = str(exc.orig).strip().splitlines()[0]
        raise ReplicaConflictError(
            f"{where} cancelled this read twice to replay the primary's changes ({first}): try "
            "again, read from the primary, or on the replica raise max_standby_streaming_delay "
            "or turn hot_standby_feedback on"
        ) from None
