"""The rate limited claim of a worker whose kinds have rate limits (:class:`~sqla_jobs.RateLimit`).

One transaction per queue on the lane's connection, after the plain and keyed claims of the same
round trip (so a limited kind never delays an unlimited one): lock the limiters with due jobs
(``SKIP LOCKED``: another worker's limiter is left to it), try-lock their jobs' concurrency keys,
claim within both limits, log the starts, and learn when each limiter at its limit admits its
next start. The fetch loop is told (:meth:`Wakeups.start_by`): it sleeps until then and claims,
the way it waits for a delayed job; nothing polls. Limiters seen for the first time are created
after the transaction, and claimed from at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqla_jobs.db.connections import AsyncConn
from sqla_jobs.kinds import Kind
from sqla_jobs.sql.compiled import WorkerSQL
from sqla_jobs.worker.holdings import Holdings
from sqla_jobs.worker.wakeups import Wakeups

#: Seconds added to a limiter's next allowed start (the loop's timer may fire a little early).
START_MARGIN = 0.001


@dataclass(frozen=True)
class RatedKinds:
    """The rate limits of the kinds a worker runs, as the claim sends them."""

    kinds: list[str]
    limits: list[int]
    pers: list[float]
    #: Some of them have a concurrency limit too: their keys are locked as the keyed claim's.
    keyed: bool

    @classmethod
    def of(cls, kinds: Iterable[Kind]) -> RatedKinds | None:
        """The rate limited kinds among ``kinds`` that have a handler; None if there are none."""
        rated = [k for k in kinds if k.handler is not None and k.options.rate_limit is not None]
        if not rated:
            return None
        limits = [k.options.rate_limit for k in rated if k.options.rate_limit is not None]
        return cls(
            kinds=[k.name for k in rated],
            limits=[r.limit for r in limits],
            pers=[r.per.total_seconds() for r in limits],
            keyed=any(k.options.concurrency_limit is not None for k in rated),
        )

    def params(self) -> dict[str, Any]:
        """The limits, as the statements of :mod:`sqla_jobs.sql.rate_limits` take them."""
        return {"kinds": self.kinds, "limits": self.limits, "pers": self.pers}


class RatedClaim:
    """Claims rate limited jobs into ``holdings`` within their limits."""

    def __init__(
        self, *, sql: WorkerSQL, rated: RatedKinds, holdings: Holdings, wakeups: Wakeups
    ) -> None:
        self._sql = sql
        self._rated = rated
        self._holdings = holdings
        self._wakeups = wakeups

    async def claim(
        self,
        conn: AsyncConn,
        queue: str,
        limit: int,
        claim_params: Callable[[str, int], dict[str, Any]],
    ) -> int:
        """Claim up to ``limit`` rate limited jobs of ``queue``; the number claimed."""
        claimed = 0
        # A second turn only for limiters created by the first: they may have room now.
        for _ in range(2):
            rows, missing = await self._claim_once(conn, queue, limit - claimed, claim_params)
            claimed += self._holdings.take(rows, time.monotonic())
            if not missing or claimed >= limit:
                break
            create = self._sql.create_rate_limiters
            await conn.execute(create.sql, create.params(keys=sorted(missing)))
        return claimed

    async def _claim_once(
        self,
        conn: AsyncConn,
        queue: str,
        limit: int,
        claim_params: Callable[[str, int], dict[str, Any]],
    ) -> tuple[list[Any], list[str]]:
        sql, limits = self._sql, self._rated.params()
        rows: list[Any] = []
        waits: list[float] = []
        # One transaction: the limiters' row locks and the keys' advisory locks are held until
        # the starts are logged, and each statement's snapshot is taken after they were granted.
        async with conn.transaction():
            lock = sql.lock_rate_limiters
            cur = await conn.execute(lock.sql, lock.params(queue=queue, scan=limit, **limits))
            found = await cur.fetchall()
            held = [str(key) for key, is_held, _ in found if is_held]
            missing = [str(key) for key, is_held, known in found if not (is_held or known)]
            if not held:
                return rows, missing
            ckeys: list[str] = []
            if self._rated.keyed:
                lock_keys = sql.lock_rated_concurrency_keys
                cur = await conn.execute(
                    lock_keys.sql, lock_keys.params(queue=queue, keys=held, scan=limit)
                )
                ckeys = [str(row[0]) for row in await cur.fetchall()]
            claim = sql.claim_rated
            params = {**claim_params(queue, limit), **limits}
            cur = await conn.execute(
                claim.sql, claim.params(**params, keys=held, concurrency_keys=ckeys)
            )
            rows = await cur.fetchall()
            if rows:
                log = sql.log_rate_starts
                await conn.execute(log.sql, log.params(ids=[row[0] for row in rows], **limits))
            waiting = sql.rate_waits
            cur = await conn.execute(waiting.sql, waiting.params(queue=queue, keys=held, **limits))
            waits = [float(cast(float, row[1])) for row in await cur.fetchall()]
        if waits:
            # The earliest next start of the limiters at their limit: the fetch loop looks then.
            self._wakeups.start_by(time.monotonic() + max(0.0, min(waits)) + START_MARGIN)
        return rows, missing
