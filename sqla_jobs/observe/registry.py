"""The worker's row in ``sqla_jobs_worker``, the registry of live workers (``sqla-jobs workers``).

Written when the worker starts (on its first claim connection), moved forward by its reaper
thread at each reap (no connection of its own), deleted when it stops gracefully. Each reap also
deletes the rows whose ``expires_at`` has passed by the database's clock: workers killed, or away
from the database for three of their beats. The registry is for people and dashboards; nothing
the worker does depends on it, so a registry it may not write (a role without the grants of
docs/roles.md, a database not yet migrated to ``sqla_jobs_0006``) is logged once and left alone.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from datetime import timedelta

import psycopg

from sqla_jobs.db.connections import CONNECTION_ERRORS, AsyncConn, Conn
from sqla_jobs.sql import workers as workers_sql
from sqla_jobs.sql.compiled import compile_statement

log = logging.getLogger("sqla_jobs.worker")

#: A row expires this many beats after its last one.
BEATS_TO_EXPIRE = 3


class Registry:
    """Worker ``name``'s row: what it works on, and its heartbeat every ``beat`` seconds."""

    def __init__(
        self,
        *,
        schema: str | None,
        name: str,
        queues: Sequence[str],
        concurrency: int,
        beat: float,
    ) -> None:
        self._register = compile_statement(workers_sql.register_worker(), schema)
        self._unregister = compile_statement(workers_sql.unregister_worker(), schema)
        self._prune = compile_statement(workers_sql.prune_workers(), schema)
        self._name = name
        self._row = self._register.params(
            name=name,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=list(queues),
            concurrency=concurrency,
            ttl=timedelta(seconds=beat * BEATS_TO_EXPIRE),
        )
        #: False once a write was refused (not a lost connection): the worker stops trying.
        self.enabled = True

    async def join(self, conn: AsyncConn) -> None:
        """Write the row (at the worker's start). A lost connection raises; a refusal is logged."""
        try:
            await conn.execute(self._register.sql, self._row)
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error as exc:
            self._refused(exc)

    def beat(self, conn: Conn) -> list[str]:
        """Move the row's heartbeat forward and delete the stale rows (on the reaper's thread);
        the names of the workers pruned. A lost connection raises; a refusal is logged."""
        if not self.enabled:
            return []
        try:
            conn.execute(self._register.sql, self._row)
            gone = [str(r[0]) for r in conn.execute(self._prune.sql, self._prune.params())]
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error as exc:
            self._refused(exc)
            return []
        for name in gone:
            log.info(
                "worker %s stopped heartbeating: removed from the registry",
                name,
                extra={"event": "worker_pruned"},
            )
        return gone

    async def leave(self, conn: AsyncConn | None) -> None:
        """Delete the row (the worker stops gracefully); never raises (a row left behind
        expires and is pruned)."""
        if not self.enabled or conn is None or conn.closed:
            return
        try:
            await conn.execute(self._unregister.sql, self._unregister.params(name=self._name))
        except psycopg.Error as exc:
            log.warning(
                "could not remove worker %s from the registry (its row expires): %s",
                self._name,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                extra={"event": "registry_failed"},
            )

    def _refused(self, exc: psycopg.Error) -> None:
        self.enabled = False
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning(
            "worker %s is not in the registry of live workers (%s: %s); it works as usual. Run "
            "the migrations (sqla_jobs_0006) and the grants of docs/roles.md on sqla_jobs_worker, "
            "then restart it",
            self._name,
            type(exc).__name__,
            first,
            extra={"event": "registry_refused"},
        )
