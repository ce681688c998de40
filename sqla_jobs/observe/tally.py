"""A worker's per-minute throughput: what it finished, by queue and kind, added to
``sqla_jobs_throughput`` at each beat of its reaper (the dashboard's chart reads it back).

The worker's loop counts each run in memory (an :class:`~sqla_jobs.observe.runs.Observer`: a dict
lookup and a few additions per job, no lock); the counts only grow, and the reaper thread writes
what they grew by since its last write (one upsert, on its own connection), so the tally costs no
round trip on the claim path and no connection or thread of its own. Only the loop writes the run
counts and only the reaper the crash counts; the reaper reads the loop's with a copy of the dict
(one step under the GIL) and of each row, so it never sees half an update. The minute a count
lands in is the database's at the write: up to one beat after the run ended. The last counts are
written when the worker stops.

A table it may not write (a database not yet migrated to ``sqla_jobs_0007``, a role without the
grants of docs/roles.md) is logged once and the tally stops counting: nothing the worker does
depends on it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psycopg

from sqla_jobs.db.connections import AsyncConn, Conn, should_reconnect
from sqla_jobs.hooks import _name_of
from sqla_jobs.sql import metrics as metrics_sql
from sqla_jobs.sql.compiled import compile_statement

if TYPE_CHECKING:
    from sqla_jobs._outcome import Outcome
    from sqla_jobs.context import ClaimedJob

log = logging.getLogger("sqla_jobs.worker")

_FIELDS = metrics_sql.THROUGHPUT_COUNTS
_AT = {name: i for i, name in enumerate(_FIELDS)}
_RUNS, _RUN_SECONDS = _AT["runs"], _AT["run_seconds"]
_PICKUPS, _PICKUP_SECONDS = _AT["pickups"], _AT["pickup_seconds"]
_CRASHED = _AT["crashed"]

#: Counts by (queue, kind), each a list in the order of :data:`_FIELDS`.
Counts = dict[tuple[str, str], list[float]]


class Tally:
    """Worker ``name``'s counts (see the module's docstring)."""

    def __init__(self, *, schema: str | None, name: str) -> None:
        self._record = compile_statement(metrics_sql.record_throughput(), schema)
        self._name = name
        #: Totals since the start: the runs (written by the loop), the crashes (by the reaper).
        self._runs: Counts = {}
        self._crashes: dict[tuple[str, str], int] = {}
        #: The totals as of the last write.
        self._written: Counts = {}
        #: False once a write was refused (not a lost connection): the tally stops.
        self.enabled = True

    def _row(self, job: ClaimedJob) -> list[float]:
        key = (job.queue, job.kind)
        row = self._runs.get(key)
        if row is None:
            row = self._runs[key] = [0] * len(_FIELDS)
        return row

    # -- what the worker tells (sqla_jobs.observe.runs.Observer): on its event loop ---------------

    def started(self, job: ClaimedJob, now: float) -> None:
        """``job``'s handler starts now: its pickup delay (the claim returned its due time)."""
        if self.enabled:
            # The row looked up inline: twice per job, on the worker's loop.
            row = self._runs.get((job.queue, job.kind)) or self._row(job)
            row[_PICKUPS] += 1
            delay = now - job[-1] * 1e-6  # type: ignore[operator]  # due_at(job), inline
            if delay > 0.0:
                row[_PICKUP_SECONDS] += delay

    def ended(self, outcome: Outcome, ran: bool) -> None:
        """A run ended with ``outcome``; its run time if it ran."""
        if self.enabled:
            job = outcome.job
            row = self._runs.get((job.queue, job.kind)) or self._row(job)
            row[_AT[_name_of(outcome)]] += 1
            if ran:
                row[_RUNS] += 1
                row[_RUN_SECONDS] += outcome.runtime

    def reaped(self, kind: str, queue: str) -> None:
        """The reaper rescued a job of ``kind`` in ``queue``: a crash. On the reaper's thread."""
        if self.enabled:
            key = (queue, kind)
            self._crashes[key] = self._crashes.get(key, 0) + 1

    # -- writing: on the reaper's thread ------------------------------------------------------

    def _totals(self) -> Counts:
        totals = {key: list(row) for key, row in self._runs.copy().items()}
        for key, n in self._crashes.items():
            totals.setdefault(key, [0] * len(_FIELDS))[_CRASHED] = n
        return totals

    def _delta(self, totals: Counts) -> Counts:
        """What ``totals`` grew by since the last write, by key (keys that did not grow left out)."""
        zero = [0] * len(_FIELDS)
        delta: Counts = {}
        for key, row in totals.items():
            before = self._written.get(key, zero)
            grown = [now - then for now, then in zip(row, before, strict=True)]
            if any(grown):
                delta[key] = grown
        return delta

    def _params(self, counts: Counts) -> dict[str, object] | None:
        if not counts:
            return None
        keys = sorted(counts)
        arrays: dict[str, object] = {
            "queue_": [q for q, _ in keys],
            "kind_": [k for _, k in keys],
        }
        for i, name in enumerate(_FIELDS):
            cast = float if name.endswith("_seconds") else int
            arrays[f"{name}_"] = [cast(counts[key][i]) for key in keys]
        return self._record.params(**arrays)

    def _pending(self) -> tuple[Counts, dict[str, object] | None]:
        """The totals now, and the parameters of the write of their growth (None: nothing grew)."""
        totals = self._totals()
        return totals, self._params(self._delta(totals))

    def flush(self, conn: Conn) -> None:
        """Write what the counts grew by since the last write (on the reaper's autocommit
        connection). A lost connection raises (the growth is written at the next beat); a refusal
        is logged once and stops the tally."""
        totals, params = self._pending() if self.enabled else ({}, None)
        if params is None:
            return
        try:
            conn.execute(self._record.sql, params)
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
            self._refused(exc)
            return
        self._written = totals

    async def close(self, conn: AsyncConn | None) -> None:
        """Write the last counts as the worker stops (on ``conn``, if still open); never raises.
        The worker's threads have stopped: nothing else reads or writes the counts."""
        if not self.enabled or conn is None or conn.closed:
            return
        totals, params = self._pending()
        if params is None:
            return
        try:
            await conn.execute(self._record.sql, params)
            self._written = totals
        except psycopg.Error as exc:
            log.warning(
                "worker %s could not write its last throughput counts: %s",
                self._name,
                _first_line(exc),
                extra={"event": "throughput_failed"},
            )

    def _refused(self, exc: psycopg.Error) -> None:
        self.enabled = False
        log.warning(
            "worker %s does not record its throughput (%s: %s); it works as usual. Run the "
            "migrations (sqla_jobs_0007) and the grants of docs/roles.md on sqla_jobs_throughput, "
            "then restart it",
            self._name,
            type(exc).__name__,
            _first_line(exc),
            extra={"event": "throughput_refused"},
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
