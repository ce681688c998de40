"""The worker's row in ``sqla_jobs_worker``, the registry of live workers (``sqla-jobs workers``).

Written when the worker starts (on its first claim connection), moved forward by its heartbeat
thread at each lease heartbeat (no connection of its own), deleted when it stops gracefully. Its
``expires_at`` is two and a half beats ahead: past it, the worker missed two heartbeats and is
shown stale, well before the leases that thread renews run out (at least three beats). Each reap
deletes the rows stale for longer than a lease that hold no running job any more. The registry is
for people and dashboards; nothing the worker does depends on it, so a registry it may not write
(a role without the grants of docs/roles.md, a database not yet migrated to ``sqla_jobs_0006``)
is logged once and left alone.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from datetime import timedelta

import psycopg

from sqla_jobs.db.connections import AsyncConn, Conn, should_reconnect
from sqla_jobs.sql import workers as workers_sql
from sqla_jobs.sql.compiled import compile_statement

log = logging.getLogger("sqla_jobs.worker")

#: A row is stale this many beats after its last one: two missed, with half a beat for a late one.
BEATS_TO_STALE = 2.5


class Registry:
    """Worker ``name``'s row: what it works on, and its heartbeat every ``beat`` seconds. Stale
    rows are pruned ``grace`` seconds after they went stale, once they hold no running job."""

    def __init__(
        self,
        *,
        schema: str | None,
        name: str,
        queues: Sequence[str],
        concurrency: int,
        beat: float,
        grace: float,
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
            ttl=timedelta(seconds=beat * BEATS_TO_STALE),
        )
        self._prune_params = self._prune.params(grace=timedelta(seconds=grace))
        #: False once a write was refused (not a lost connection): the worker stops trying.
        self.enabled = True

    async def join(self, conn: AsyncConn) -> None:
        """Write the row (at the worker's start). A lost connection raises; a refusal is logged."""
        try:
            await conn.execute(self._register.sql, self._row)
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
            self._refused(exc)

    def beat(self, conn: Conn) -> None:
        """Move the row's heartbeat forward (on the heartbeat thread). A lost connection raises; a
        refusal is logged."""
        if not self.enabled:
            return
        try:
            conn.execute(self._register.sql, self._row)
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
            self._refused(exc)

    def prune(self, conn: Conn) -> list[str]:
        """Delete the rows long stale that hold no running job (on the reaper's thread); the names
        of the workers pruned. A lost connection raises; a refusal is logged."""
        if not self.enabled:
            return []
        try:
            gone = [str(r[0]) for r in conn.execute(self._prune.sql, self._prune_params)]
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
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
        if not self.enabled:
            return  # the other thread's write was refused at the same time, and said so
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
