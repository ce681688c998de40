"""The pruner thread: deletes finished jobs past their retention, one worker at a time.

Every ``interval`` seconds (the first run at a random point of the first interval, so workers
started together do not all try at once) the pruner tries to become *the* pruner of its queue
table, then deletes what :class:`~sqla_jobs.retention.Retention` no longer keeps: ``completed``,
``dead`` and ``cancelled`` rows of ``sqla_jobs_job`` and the rows of ``sqla_jobs_history``, in
batches of :data:`BATCH` rows, each batch one statement in a transaction of its own (autocommit),
resting after each :data:`REST` times as long as it took (a tenth of a core at most, whatever the
backlog: retention is background work, and the claims come first).

The election is a *session-level* advisory lock (``pg_try_advisory_lock``), taken on the pruner's
own connection and released when the run ends. A transaction-scoped lock would have to be held
by one transaction spanning every batch: a run over a million rows would then be one long
transaction, pinning the xmin horizon (vacuum could not remove the rows it deletes, nor the claims'
dead row versions) for its whole length. A session lock holds no snapshot and no transaction; the
batches stay short, and if the connection or the process dies the server releases the lock at once,
so no lease row has to expire (and no table is needed for one). Another worker's try fails and it
skips its run: it never waits. No claim takes this lock, so no claim waits on it either; the
batches lock only the rows they delete, ``SKIP LOCKED``.

The one thing a session lock needs is a session: behind PgBouncer in transaction pooling it would
be left on a pooled server connection. Run such workers with ``--no-prune`` and prune from a
direct connection (``sqla-jobs prune``, or one worker that connects directly).
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta

import psycopg

from sqla_jobs.db.connections import (
    Conn,
    Connector,
    Reconnects,
    close_quietly,
    serve,
    should_reconnect,
)
from sqla_jobs.model import JobState
from sqla_jobs.retention import Retention
from sqla_jobs.sql import limiters as limiters_sql
from sqla_jobs.sql import maintenance as maintenance_sql
from sqla_jobs.sql import workflows as workflows_sql
from sqla_jobs.sql.compiled import compile_statement

log = logging.getLogger("sqla_jobs.worker")

#: After each batch the pruner rests this many times as long as the batch took.
REST = 9.0

#: Rows deleted per statement: each batch is a short transaction, whatever the backlog.
BATCH = 1000
#: The key of the history rows in a run's counts.
HISTORY = "history"
#: The key of the recorded outcomes of parents (job dependencies) in a run's counts: kept as
#: long as dead jobs.
OUTCOMES = "outcomes"
#: The key of the dependency edges of children gone from the job table in a run's counts.
EDGES = "edges"
#: The key of the per-minute throughput rows in a run's counts.
THROUGHPUT = "throughput"
#: The key of the idle rate limiters in a run's counts.
RATE_LIMITERS = "rate_limiters"
_COMPLETED = JobState.COMPLETED.value
#: "Key (id)=(42) is still referenced from table ...": a foreign key of the application's.
_REFERENCED = re.compile(r"Key \(id\)=\((\d+)\)")


class PruneSQL:
    """The retention statements, compiled for one schema."""

    def __init__(self, schema: str | None) -> None:
        self.schema = schema
        self.prune_jobs = compile_statement(maintenance_sql.prune_jobs(), schema)
        self.count_jobs = compile_statement(maintenance_sql.count_prunable_jobs(), schema)
        self.prune_history = compile_statement(maintenance_sql.prune_history(), schema)
        self.count_history = compile_statement(maintenance_sql.count_prunable_history(), schema)
        self.prune_throughput = compile_statement(maintenance_sql.prune_throughput(), schema)
        self.prune_outcomes = compile_statement(workflows_sql.prune_outcomes(), schema)
        self.prune_edges = compile_statement(workflows_sql.prune_edges(), schema)
        self.prune_rate_limiters = compile_statement(limiters_sql.prune_rate_limiters(), schema)
        self.try_lock = compile_statement(maintenance_sql.try_lock_pruner(), schema)
        self.unlock = compile_statement(maintenance_sql.unlock_pruner(), schema)


def _us(keep: timedelta) -> int:
    return keep // timedelta(microseconds=1)


def prune(
    conn: Conn,
    sql: PruneSQL,
    older_than: Mapping[str, timedelta | None],
    *,
    batch: int = BATCH,
    stopping: Callable[[], bool] = lambda: False,
    rest: Callable[[float], object] | None = None,
) -> dict[str, int]:
    """Delete the finished jobs older than ``older_than[state]`` (None: keep), batch after batch
    on the autocommit connection ``conn``, until none is left or ``stopping()``; the rows deleted
    per state, and from history (``completed`` only, today) under :data:`HISTORY`.

    A ``completed`` row that the application's foreign keys still reference cannot be deleted: it
    is stepped over for the rest of the run and tried again the next run. After each full batch,
    ``rest`` (if given) is called with the seconds the batch took: the pruner and the command
    rest :data:`REST` times that long, so that a large backlog takes at most a tenth of a core
    from the claims.
    """
    counts: dict[str, int] = {}
    for state, keep in older_than.items():
        if keep is not None:
            counts[state] = _prune_jobs(conn, sql, state, _us(keep), batch, stopping, rest)
    dead = older_than.get(JobState.DEAD.value)
    if dead is not None:
        counts[OUTCOMES] = _drain(
            conn,
            sql.prune_outcomes.sql,
            sql.prune_outcomes.params(older_than_us=_us(dead), limit=batch),
            batch,
            stopping,
            rest,
        )
    # History last: a role that may not delete from it (docs/roles.md) still prunes the job table.
    keep = older_than.get(_COMPLETED)
    if keep is not None:
        counts[HISTORY] = _drain(
            conn,
            sql.prune_history.sql,
            sql.prune_history.params(outcome=_COMPLETED, older_than_us=_us(keep), limit=batch),
            batch,
            stopping,
            rest,
        )
    return counts


def _drain(
    conn: Conn,
    query: str,
    params: dict[str, object],
    batch: int,
    stopping: Callable[[], bool],
    rest: Callable[[float], object] | None,
) -> int:
    total = 0
    while not stopping():
        t0 = time.perf_counter()
        deleted = conn.execute(query, params).rowcount
        total += deleted
        if deleted < batch:
            break
        if rest is not None:
            rest(time.perf_counter() - t0)
    return total


def _prune_jobs(
    conn: Conn,
    sql: PruneSQL,
    state: str,
    older_than_us: int,
    batch: int,
    stopping: Callable[[], bool],
    rest: Callable[[float], object] | None,
) -> int:
    skip: list[int] = []
    total = 0
    while not stopping():
        t0 = time.perf_counter()
        params = sql.prune_jobs.params(
            state=state, older_than_us=older_than_us, limit=batch, skip=skip
        )
        try:
            deleted = conn.execute(sql.prune_jobs.sql, params).rowcount
        except (psycopg.errors.ForeignKeyViolation, psycopg.errors.RestrictViolation) as exc:
            # PostgreSQL 18 reports an ON DELETE RESTRICT key as a RestrictViolation (23001).
            found = _REFERENCED.search(exc.diag.message_detail or "")
            if found is None:
                log.warning("cannot prune %s jobs: %s", state, exc, extra={"event": "prune_kept"})
                break
            skip.append(int(found[1]))
            continue
        total += deleted
        if deleted < batch:
            break
        if rest is not None:
            rest(time.perf_counter() - t0)
    if skip:
        log.info(
            "kept %d %s jobs still referenced by a foreign key (first: %d)",
            len(skip),
            state,
            skip[0],
            extra={"event": "prune_kept", "state": state},
        )
    return total


def count(conn: Conn, sql: PruneSQL, older_than: Mapping[str, timedelta | None]) -> dict[str, int]:
    """What :func:`prune` would delete now, in the same shape; reads only, locks nothing."""
    counts: dict[str, int] = {}
    for state, keep in older_than.items():
        if keep is None:
            continue
        params = sql.count_jobs.params(state=state, older_than_us=_us(keep))
        counts[state] = _scalar(conn, sql.count_jobs.sql, params)
        if state == _COMPLETED:
            params = sql.count_history.params(outcome=state, older_than_us=_us(keep))
            counts[HISTORY] = _scalar(conn, sql.count_history.sql, params)
    return counts


def _scalar(conn: Conn, query: str, params: dict[str, object]) -> int:
    found = conn.execute(query, params).fetchone()
    return int(found[0]) if found is not None else 0  # type: ignore[call-overload]


def describe(counts: Mapping[str, int]) -> str:
    """``completed=3 history=1000 dead=2 cancelled=0``: a run's counts, for a log line."""
    return " ".join(f"{name}={n}" for name, n in counts.items())


class Pruner(threading.Thread):
    """Every ``interval`` seconds, if no other worker is pruning, delete what ``retention`` no
    longer keeps (see the module's docstring); one log line per run that deleted something."""

    def __init__(
        self, *, connector: Connector, schema: str | None, retention: Retention, interval: float
    ) -> None:
        super().__init__(name=f"sqla-jobs-pruner-{connector.worker}", daemon=True)
        self._connector = connector
        self._sql = PruneSQL(schema)
        self._retention = retention
        self._interval = interval
        self._stop_event = threading.Event()
        self._conn: Conn | None = None
        #: Runs made, skipped (another worker held the lock), failed; rows deleted in all.
        self.runs = 0
        self.skipped = 0
        self.failed = 0
        self.pruned = 0
        #: The role may not delete rate limiters (its grants predate them): not tried again.
        #: The side tables this worker's role may not prune (granted before they existed).
        self._refused: set[str] = set()

    def stop(self) -> None:
        """Ask the thread to stop after the current batch and exit."""
        self._stop_event.set()

    def run(self) -> None:
        if self._stop_event.wait(random.uniform(0, self._interval)):
            return
        reconnects = Reconnects("pruner connection", "prune_conn_lost")
        serve(
            self._stop_event,
            self._step,
            reconnects,
            close=self._close,
            current=lambda: self._conn,
        )

    def _step(self) -> float:
        try:
            self.prune_once()
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
            # A refused privilege (a worker role without DELETE on history), a statement timeout:
            # logged, tried again next interval; the worker itself carries on.
            self.failed += 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning(
                "prune failed, next try in %gs: %s: %s",
                self._interval,
                type(exc).__name__,
                first,
                extra={"event": "prune_failed"},
            )
        return self._interval

    def _connection(self) -> Conn:
        if self._conn is None or self._conn.closed:
            self._conn = self._connector.connect("pruner", connect_timeout=5)
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)

    def _prune_side(self, conn: Conn, name: str, what: str, table: str) -> int:
        """One batch of rows of a side table that nothing needs any more (``name``: its counts
        key and statement); a role not granted DELETE on ``table`` says so once, and the rest of
        the pruning goes on."""
        if name in self._refused:
            return 0
        stmt = getattr(self._sql, f"prune_{name}")
        try:
            return int(conn.execute(stmt.sql, stmt.params(limit=BATCH)).rowcount)
        except psycopg.errors.InsufficientPrivilege as exc:
            self._refused.add(name)
            log.warning(
                "cannot prune %s (%s); grant DELETE on %s",
                what,
                str(exc).splitlines()[0],
                table,
                extra={"event": f"{name}_refused"},
            )
            return 0

    def prune_once(self) -> dict[str, int] | None:
        """One run: the rows deleted, or None if another worker is pruning."""
        conn = self._connection()
        key = {"schema_name": self._sql.schema}
        if not _scalar(conn, self._sql.try_lock.sql, self._sql.try_lock.params(**key)):
            self.skipped += 1
            log.debug("prune skipped: another worker is pruning", extra={"event": "prune_skipped"})
            return None
        t0 = time.perf_counter()
        try:
            counts = prune(
                conn,
                self._sql,
                self._retention.by_state(),
                stopping=self._stop_event.is_set,
                rest=lambda took: self._stop_event.wait(took * REST),
            )
            keep = self._retention.throughput
            if keep is not None and not self._stop_event.is_set():
                # Minutes no worker writes any more: one short delete, nothing waits on it.
                params = self._sql.prune_throughput.params(older_than_us=_us(keep))
                counts[THROUGHPUT] = conn.execute(self._sql.prune_throughput.sql, params).rowcount
            if not self._stop_event.is_set():
                # Limiters idle for a whole window (a by= key seen once) limit nothing, and a
                # key's next claim makes its row again; an edge is dead weight once its child
                # has left the job table.
                counts[RATE_LIMITERS] = self._prune_side(
                    conn, RATE_LIMITERS, "idle rate limiters", "sqla_jobs_rate_limiter"
                )
                counts[EDGES] = self._prune_side(
                    conn, EDGES, "the edges of children gone", "sqla_jobs_dependency"
                )
        finally:
            conn.execute(self._sql.unlock.sql, self._sql.unlock.params(**key))
        self.runs += 1
        deleted = sum(counts.values())
        self.pruned += deleted
        log.log(
            logging.INFO if deleted else logging.DEBUG,
            "pruned %s in %.2fs",
            describe(counts),
            time.perf_counter() - t0,
            extra={"event": "pruned", **counts},
        )
        return counts
