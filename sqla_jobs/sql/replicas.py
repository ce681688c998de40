"""What a read replica is asked: where it stands in the write-ahead log.

Lag is a distance in WAL bytes, never the age of the last replayed transaction: on an idle primary
nothing is replayed, so that age grows while the replica is fully caught up.
"""

from __future__ import annotations

from sqlalchemy import Select, select, text

__all__ = ["wal_position"]


def wal_position() -> Select[tuple[object, ...]]:
    """Whether the server is a standby (``in_recovery``) and its WAL position as text (``lsn``):
    on a standby the last position replayed, on a primary the current insert position (past every
    commit made so far, even one made with ``synchronous_commit`` off and not yet written).

    Locks nothing and reads no table. A standby that has replayed nothing since it started
    streaming gives NULL; a promoted one answers as a primary. The ``CASE`` keeps
    ``pg_current_wal_insert_lsn()``, which fails during recovery, from running on a standby.
    """
    return select(
        text(
            "pg_is_in_recovery() AS in_recovery, "
            "CAST(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_insert_lsn() END AS text) AS lsn"
        )
    )
