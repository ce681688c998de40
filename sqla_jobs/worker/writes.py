"""Writing outcomes: a batch's completions in one statement, each failure in one, all fenced on
the lease; and, when a batch cannot be written for a reason other than a lost connection, each
outcome on its own, so that the one at fault is isolated and reported and every other is written.

A completed job whose row cannot be deleted (the application's foreign key points at it) is kept
in the terminal ``completed`` state: no claim takes it, so a handler that succeeded never runs
again because of its row.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import psycopg

from sqla_jobs._outcome import Outcome, fail_params
from sqla_jobs.db.connections import AsyncConn, should_reconnect
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.leases import pg_array

log = logging.getLogger("sqla_jobs.worker")

Cursor = psycopg.AsyncCursor[tuple[object, ...]]


def outcome_statement(sql: WorkerSQL, outcome: Outcome) -> tuple[str, dict[str, Any]]:
    """The statement and parameters that write an outcome other than a completion."""
    job = outcome.job
    if outcome.snooze_us is not None:
        return sql.snooze.sql, sql.snooze.params(
            id=job.id, token=job.lease_token, delay_us=outcome.snooze_us
        )
    if outcome.cancelled:
        return sql.finish_cancelled.sql, sql.finish_cancelled.params(
            id=job.id, token=job.lease_token, error=outcome.error
        )
    return sql.fail.sql, fail_params(sql, outcome)


class SuccessLog:
    """One INFO line per completed job, with its duration, up to :data:`LINES_PER_SECOND` a
    second; past that, one line a second says how many more completed and how long they took, so
    a busy worker's log stays readable and cheap."""

    #: Completed jobs logged one by one each second, at most.
    LINES_PER_SECOND = 20

    def __init__(self) -> None:
        self._window = 0.0
        self._left = self.LINES_PER_SECOND
        self._more = 0
        self._more_seconds = 0.0

    def log(self, done: list[Outcome]) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._flush()
            self._window, self._left = now, self.LINES_PER_SECOND
        for outcome in done[: self._left]:
            job = outcome.job
            log.info(
                "job %s (%s) completed in %.1f ms",
                job.id,
                job.kind,
                outcome.runtime * 1000,
                extra={
                    "event": "completed",
                    "job_id": job.id,
                    "kind": job.kind,
                    "duration_ms": round(outcome.runtime * 1000, 3),
                },
            )
        if len(done) > self._left:
            rest = done[self._left :]
            self._more += len(rest)
            self._more_seconds += sum(o.runtime for o in rest)
        self._left = max(0, self._left - len(done))

    def _flush(self) -> None:
        if self._more:
            log.info(
                "and %d more jobs completed in the last second (%.2f ms each on average)",
                self._more,
                self._more_seconds / self._more * 1000,
                extra={"event": "completed_more", "jobs": self._more},
            )
        self._more, self._more_seconds = 0, 0.0


class OutcomeWriter:
    """Sends and reads the outcome writes of one worker; counts them in ``counts``."""

    def __init__(self, sql: WorkerSQL, keep_history: bool, counts: dict[str, int]) -> None:
        self._sql = sql
        self._complete = sql.complete_into_history if keep_history else sql.complete
        self._complete_results = (
            sql.complete_into_history_with_results if keep_history else sql.complete_with_results
        )
        self._counts = counts
        self._successes = SuccessLog()

    async def send(
        self, conn: AsyncConn, batch: list[Outcome]
    ) -> tuple[list[Outcome], list[Cursor], list[tuple[Outcome, Cursor]]]:
        """Send ``batch``'s writes (in a pipeline nothing is read until it ends); returns what
        :meth:`read` needs."""
        # One completion per claim (usually one or two in a batch): each is exact on its token.
        # Keyed by the token's int: UUID's own hash and equality are Python calls, per job.
        claims: dict[int, tuple[uuid.UUID, list[int]]] = {}
        # Jobs of kinds that store results: their own statement per claim, the rest unchanged.
        with_results: dict[int, tuple[uuid.UUID, list[int], list[str]]] = {}
        others = []
        for o in batch:
            if o.error is None and o.snooze_us is None:
                job = o.job
                token = job.lease_token
                if o.result is not None:
                    held = with_results.get(token.int)
                    if held is None:
                        held = with_results[token.int] = (token, [], [])
                    held[1].append(job.id)
                    held[2].append(o.result)
                    continue
                claim = claims.get(token.int)
                if claim is None:
                    claim = claims[token.int] = (token, [])
                claim[1].append(job.id)
            else:
                others.append(o)
        complete = self._complete
        done_curs = [
            await conn.execute(complete.sql, complete.params(ids=pg_array(ids), token=token))
            for token, ids in claims.values()
        ]
        if with_results:
            complete = self._complete_results
            for token, ids, results in with_results.values():
                params = complete.params(ids=pg_array(ids), token=token, results=results)
                done_curs.append(await conn.execute(complete.sql, params))
        other_curs = [(o, await conn.execute(*outcome_statement(self._sql, o))) for o in others]
        done = [o for o in batch if o.error is None and o.snooze_us is None]
        return done, done_curs, other_curs

    async def read(
        self, done: list[Outcome], done_curs: list[Cursor], fail_curs: list[tuple[Outcome, Cursor]]
    ) -> None:
        """Count and log what :meth:`send` wrote."""
        if done_curs:
            written = 0
            for cur in done_curs:
                written += len(await cur.fetchall())
            self._count_done(len(done), written)
            if written == len(done):
                self._successes.log(done)
        for outcome, cur in fail_curs:
            self._log_written(outcome, await cur.fetchone())

    def committed(self, outcome: Outcome) -> None:
        """Count and log a completion committed in its handler's own transaction."""
        self._counts["done"] += 1
        self._successes.log([outcome])

    async def isolate(self, conn: AsyncConn, batch: list[Outcome]) -> list[Outcome]:
        """Write each outcome of ``batch`` on its own (after the batch as a whole failed). Returns
        the outcomes not written because the connection was lost (to be retried)."""
        for i, outcome in enumerate(batch):
            try:
                await self._write_one(conn, outcome)
            except psycopg.Error as exc:
                if not should_reconnect(exc):
                    raise
                return batch[i:]
        return []

    async def _write_one(self, conn: AsyncConn, outcome: Outcome) -> None:
        job = outcome.job
        try:
            sent, done_cur, fail_curs = await self.send(conn, [outcome])
            await self.read(sent, done_cur, fail_curs)
            return
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
            error = exc
        if outcome.error is not None or outcome.snooze_us is not None:
            log.error(
                "job %s (%s): its outcome could not be recorded (%s: %s); its lease will expire "
                "and it will run again",
                job.id,
                job.kind,
                type(error).__name__,
                error,
                extra={"event": "write_failed", "job_id": job.id, "kind": job.kind},
            )
            return
        reason = f"completed; not deleted: {type(error).__name__}: {error}".replace("\n", " ")
        if outcome.result is None:
            keep = self._sql.keep_completed
            params = keep.params(id=job.id, token=job.lease_token, error=reason)
        else:  # the result stored in the same statement
            keep = self._sql.keep_completed_with_result
            params = keep.params(
                job_id=job.id, token=job.lease_token, error=reason, result=outcome.result
            )
        try:
            cur = await conn.execute(keep.sql, params)
            kept = await cur.fetchone()
        except psycopg.Error as exc:
            if should_reconnect(exc):
                raise
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

    def _log_written(self, outcome: Outcome, row: Any) -> None:
        """Count and log an outcome other than a completion, from the row its write returned
        (None: the fence refused it, the lease was lost)."""
        job = outcome.job
        extra: dict[str, Any] = {"job_id": job.id, "kind": job.kind}
        if row is None:
            log.warning(
                "job %s: lease lost before its outcome was recorded",
                job.id,
                extra={"event": "lease_lost", "job_id": job.id},
            )
        elif outcome.cancelled:
            self._counts["cancelled"] += 1
            log.info(
                "job %s (%s) %s",
                job.id,
                job.kind,
                outcome.error,
                extra={"event": "cancelled", **extra},
            )
        elif outcome.lost is not None:
            self._counts["snoozed"] += 1
            log.warning(
                "job %s (%s) met the database's outage (%s): back in the queue at %s, no attempt "
                "charged",
                job.id,
                job.kind,
                outcome.lost,
                row[1],
                extra={"event": "run_lost", **extra},
            )
        elif outcome.snooze_us is not None:
            self._counts["snoozed"] += 1
            log.info(
                "job %s (%s) snoozed: %s at %s",
                job.id,
                job.kind,
                row[0],
                row[1],
                extra={"event": "snoozed", **extra},
            )
        elif row[0] == "dead":
            self._counts["dead"] += 1
            log.error(
                "job %s (%s) dead after attempt %s: %s",
                job.id,
                job.kind,
                job.attempts,
                outcome.error,
                extra={"event": "dead", **extra},
            )
        else:
            self._counts["failed"] += 1
            log.warning(
                "job %s (%s) failed attempt %s, retry at %s: %s",
                job.id,
                job.kind,
                job.attempts,
                row[1],
                outcome.error,
                # run_at as a value, for a handler that shows when the retry is due.
                extra={"event": "failed", "run_at": row[1], **extra},
            )
