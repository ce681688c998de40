"""The heartbeat thread: keeps the leases of every job this worker holds alive.

It runs in its own OS thread on its own connection, so neither a handler that blocks the event loop
nor a slow claim can starve a heartbeat, and the reaper (:mod:`sqla_jobs.worker.reaper`) never waits
behind it. A row another session has locked is skipped, not waited for: it can delay at most its
own renewal. Each beat, after the renewal, also beats the worker's row in the registry of live
workers (:mod:`sqla_jobs.observe.registry`): a worker is shown stale when the very thread its
leases depend on stops beating, well before they run out.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection
from datetime import timedelta

from sqla_jobs.db.connections import Conn, ConnectionThread, Connector
from sqla_jobs.sql.compiled import WorkerSQL

log = logging.getLogger("sqla_jobs.worker")

#: A lease: the job's id and the token of the claim that holds it.
Held = tuple[int, uuid.UUID]
Snapshot = Callable[[], Collection[Held]]
OnLost = Callable[[set[Held]], None]


def pg_array(values: Collection[object]) -> str:
    """Ints or UUIDs as a Postgres array literal (the statement casts it): psycopg's array dumper
    costs a regex search per element, which a batch of completions feels."""
    return "{" + ",".join(map(str, values)) + "}"


def held_params(held: Collection[Held]) -> dict[str, str]:
    """The ``ids`` and ``tokens`` parallel arrays of the statements fenced on (id, token) pairs.
    The jobs of one claim share its token: each distinct token is formatted once."""
    text: dict[uuid.UUID, str] = {}
    tokens = [text.get(t) or text.setdefault(t, str(t)) for _, t in held]
    return {
        "ids": "{" + ",".join([str(i) for i, _ in held]) + "}",
        "tokens": "{" + ",".join(tokens) + "}",
    }


class LeaseKeeper(ConnectionThread):
    """Every ``heartbeat`` seconds: extend the leases of ``snapshot()``'s jobs; report through
    ``on_lost`` the ones another worker may own now; then call ``alive`` (if any) on its
    connection (the registry's heartbeat). While ``paused`` is set, no heartbeat is sent (a
    test's stand-in for a frozen process)."""

    def __init__(
        self,
        *,
        connector: Connector,
        sql: WorkerSQL,
        lease: timedelta,
        heartbeat: float,
        snapshot: Snapshot,
        on_lost: OnLost,
        on_cancel: Callable[[list[int]], None] | None = None,
        paused: threading.Event | None = None,
        alive: Callable[[Conn], object] | None = None,
    ) -> None:
        # No startup options on this connection (PgBouncer refuses them): a renewal skips
        # locked rows, so it waits for no row lock anyway.
        super().__init__(connector, "leases", what="lease connection", event="lease_conn_lost")
        self._sql = sql
        self._lease = lease
        self._heartbeat = heartbeat
        self._snapshot = snapshot
        self._on_lost = on_lost
        self._on_cancel = on_cancel
        self._paused = paused or threading.Event()
        self._alive = alive
        self._locked_before: set[Held] = set()

    def step(self) -> float:
        started = time.monotonic()
        # Connected from the start, held or not: a job's lease must be renewable even while the
        # database refuses new connections (the worker's other connections may be down then).
        self.connection()
        if not self._paused.is_set():
            self.beat()
            if self._alive is not None:
                self._alive(self.connection())
        return max(0.0, self._heartbeat - (time.monotonic() - started))

    def beat(self) -> None:
        """Extend the leases of the jobs held now; report the lost ones."""
        held = list(self._snapshot())
        if not held:
            return
        conn = self.connection()
        params = held_params(held)
        rows = conn.execute(
            self._sql.heartbeat.sql, self._sql.heartbeat.params(lease=self._lease, **params)
        ).fetchall()
        renewed = {int(r[0]) for r in rows}  # type: ignore[call-overload]
        cancels = [int(r[0]) for r in rows if r[1]]  # type: ignore[call-overload]
        if cancels and self._on_cancel is not None:
            # The floor under the cancel NOTIFY (a worker whose listener was away hears it here).
            self._on_cancel(cancels)
        missing = [h for h in held if h[0] not in renewed]
        if not missing:
            self._locked_before = set()
            return
        # Lost, or locked by another session: a plain read (it waits for no lock) tells which.
        still = conn.execute(
            self._sql.held_leases.sql, self._sql.held_leases.params(**held_params(missing))
        ).fetchall()
        kept = {int(r[0]) for r in still}  # type: ignore[call-overload]
        locked = [h for h in missing if h[0] in kept]
        # A row this worker's own completion holds for a moment is skipped too: only a row
        # locked at two beats in a row is worth a line.
        again = [h for h in locked if h in self._locked_before]
        self._locked_before = set(locked)
        if again:
            locked = again
            log.warning(
                "%d leases not renewed at two beats in a row: their rows are locked by another "
                "session (jobs %s)",
                len(locked),
                ",".join(str(i) for i, _ in locked[:10]),
                extra={"event": "lease_row_locked"},
            )
        lost = {h for h in missing if h[0] not in kept}
        if lost:
            self._on_lost(lost)
