"""A LISTEN connection of a test's own, on the jobs' channel: what the workers would hear."""

from __future__ import annotations

import secrets

import psycopg
from psycopg import sql

from sqla_jobs.db.urls import libpq_conninfo
from tests._waiting import DEADLINE

#: How long "no notification" is watched for: the notifier sends within milliseconds.
QUIET = 0.3
#: The deadline of a notification that must come: within() returns when it arrives, so a loaded
#: machine gets time and an idle one waits no longer.
ARRIVES = DEADLINE


class Heard:
    """A LISTEN connection of its own on ``channel``."""

    def __init__(self, url: str, channel: str) -> None:
        self._channel = channel
        self._conninfo = libpq_conninfo(url)
        self._conn = psycopg.connect(self._conninfo, autocommit=True)
        self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def drain(self) -> None:
        """Read past every notification already sent: up to a marker of its own, which arrives
        after them (a fixed window would miss one that a loaded machine delivers late)."""
        marker = f"drain-marker-{secrets.token_hex(4)}"
        # Sent from another session: one this session sent itself arrives during its own
        # execute(), which psycopg before 3.2 hands to handlers only, never to notifies().
        with psycopg.connect(self._conninfo, autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, %s)", (self._channel, marker))
        for note in self._conn.notifies(timeout=DEADLINE):
            if note.payload == marker:
                return
        raise AssertionError(f"own marker NOTIFY not delivered in {DEADLINE}s")

    def within(self, seconds: float) -> list[str]:
        """The queues notified within ``seconds``: after the first arrives, what follows it
        within :data:`QUIET` (a duplicate would come from the same send or the next one)."""
        first = [n.payload for n in self._conn.notifies(timeout=seconds, stop_after=1)]
        if not first:
            return []
        return first + [n.payload for n in self._conn.notifies(timeout=QUIET)]

    def close(self) -> None:
        self._conn.close()
