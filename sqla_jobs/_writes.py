"""Writing outcomes: a batch's completions in one statement, each failure in one, all fenced on
the lease; and, when a batch cannot be written for a reason other than a lost connection, each
outcome on its own, so that the one at fault is isolated and reported and every other is written.

A completed job whose row cannot be deleted (the application's foreign key points at it) is kept
in the terminal ``completed`` state: no claim takes it, so a handler that succeeded never runs
again because of its row.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg

from ._connections import CONNECTION_ERRORS, AsyncConn
from ._leases import pg_array
from ._outcome import Outcome, fail_params
from ._sql import WorkerSQL

log = logging.getLogger("sqla_jobs.worker")

Cursor = psycopg.AsyncCursor[tuple[object, ...]]


class OutcomeWriter:
    """Sends and reads the outcome writes of one worker; counts them in ``counts``."""

    def __init__(self, sql: WorkerSQL, keep_history: bool, counts: dict[str, int]) -> None:
        self._sql = sql
        self._complete = sql.complete_into_history if keep_history else sql.complete
        self._counts = counts

    async def send(
        self, conn: AsyncConn, batch: list[Outcome]
    ) -> tuple[int, list[Cursor], list[tuple[Outcome, Cursor]]]:
        """Send ``batch``'s writes (in a pipeline nothing is read until it ends); returns what
        :meth:`read` needs."""
        # One completion per claim (usually one or two in a batch): each is exact on its token.
        claims: dict[uuid.UUID, list[int]] = {}
        sent = 0
        for o in batch:
            if o.error is None:
                claims.setdefault(o.job.lease_token, []).append(o.job.id)
                sent += 1
        complete = self._complete
        done_curs = [
            await conn.execute(complete.sql, complete.params(ids=pg_array(ids), token=token))
            for token, ids in claims.items()
        ]
        fail_curs = [
            (o, await conn.execute(self._sql.fail.sql, fail_params(self._sql, o)))
            for o in batch
            if o.error is not None
        ]
        return sent, done_curs, fail_curs

    async def read(
        self, sent: int, done_curs: list[Cursor], fail_curs: list[tuple[Outcome, Cursor]]
    ) -> None:
        """Count and log what :meth:`send` wrote."""
        if done_curs:
            written = 0
            for cur in done_curs:
                written += len(await cur.fetchall())
            self._count_done(sent, written)
        for outcome, cur in fail_curs:
            self._log_failure(outcome, await cur.fetchone())

    async def isolate(self, conn: AsyncConn, batch: list[Outcome]) -> list[Outcome]:
        """Write each outcome of ``batch`` on its own (after the batch as a whole failed). Returns
        the outcomes not written because the connection was lost (to be retried)."""
        for i, outcome in enumerate(batch):
            try:
                await self._write_one(conn, outcome)
            except CONNECTION_ERRORS:
                return batch[i:]
        return []

    async def _write_one(self, conn: AsyncConn, outcome: Outcome) -> None:
        job = outcome.job
        try:
            sent, done_cur, fail_curs = await self.send(conn, [outcome])
            await self.read(sent, done_cur, fail_curs)
            return
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error as exc:
            error = exc
        if outcome.error is not None:
            log.error(
                "job %s (%s): its failure could not be recorded (%s: %s); its lease will expire "
                "and it will run again",
                job.id,
                job.kind,
                type(error).__name__,
                error,
                extra={"event": "write_failed", "job_id": job.id, "kind": job.kind},
            )
            return
        reason = f"completed; not deleted: {type(error).__name__}: {error}".replace("\n", " ")
        try:
            cur = await conn.execute(
                self._sql.keep_completed.sql,
                self._sql.keep_completed.params(id=job.id, token=job.lease_token, error=reason),
            )
            kept = await cur.fetchone()
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error as exc:
            log.error(
                "job %s (%s) succeeded, but its row can be neither deleted (%s) nor kept as "
                "completed (%s): it will run again when its lease expires",
                job.id,
                job.kind,
                error,
                exc,
                extra={"event": "write_failed", "job_id": job.id, "kind": job.kind},
            )
            return
        if kept is None:
            self._count_done(1, 0)
            return
        self._counts["done"] += 1
        log.error(
            "job %s (%s) succeeded, but its row could not be deleted (%s); kept in state "
            "'completed', it will not run again",
            job.id,
            job.kind,
            str(error).splitlines()[0],
            extra={"event": "kept_completed", "job_id": job.id, "kind": job.kind},
        )

    def _count_done(self, sent: int, written: int) -> None:
        self._counts["done"] += written
        if written < sent:
            log.warning(
                "%d completions refused by the lease fence (leases lost; the jobs belong "
                "to other workers now)",
                sent - written,
                extra={"event": "lease_lost"},
            )

    def _log_failure(self, outcome: Outcome, row: Any) -> None:
        job = outcome.job
        if row is None:
            log.warning(
                "job %s: lease lost before its failure was recorded",
                job.id,
                extra={"event": "lease_lost", "job_id": job.id},
            )
            return
        state, run_at = row[0], row[1]
        if state == "dead":
            self._counts["dead"] += 1
            log.error(
                "job %s (%s) dead after attempt %s: %s",
                job.id,
                job.kind,
                job.attempts,
                outcome.error,
                extra={"event": "dead", "job_id": job.id, "kind": job.kind},
            )
        else:
            self._counts["failed"] += 1
            log.warning(
                "job %s (%s) failed attempt %s, retry at %s: %s",
                job.id,
                job.kind,
                job.attempts,
                run_at,
                outcome.error,
                extra={"event": "failed", "job_id": job.id, "kind": job.kind},
            )
