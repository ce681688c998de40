"""The yardstick: the design doc's queue in plain psycopg 3, with its own ``jobs`` table.

Exactly the doc's SQL: a single claim (``UPDATE ... WHERE id = (SELECT ... LIMIT 1 FOR UPDATE SKIP
LOCKED) RETURNING``) and delete on success; the insert wrapped in a CTE that fires ``pg_notify`` in
the same statement; a LISTEN worker that claims when notified and polls as the floor. Two variants
the doc does not have, to give sqla-jobs a fair opponent: a batched claim (up to 100 rows per
statement, delete by id array) and a bulk insert through COPY.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

CHANNEL = "jobs"
BATCH = 100

SCHEMA = """
CREATE TABLE jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    kind text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL DEFAULT 'pending',
    run_at timestamptz NOT NULL DEFAULT now(),
    attempts int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL DEFAULT 5,
    locked_at timestamptz,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_ready_idx ON jobs (run_at) WHERE state = 'pending';
ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000);
"""

INSERT_ONE = """
WITH j AS (
    INSERT INTO jobs (kind, payload, run_at, max_attempts)
    VALUES (%s, %s, now() + make_interval(secs => %s::float8 / 1000), %s)
    RETURNING id
)
SELECT j.id, pg_notify('jobs', '') FROM j
"""

_CLAIMED = "RETURNING id, kind, payload, attempts, max_attempts"

CLAIM_ONE = f"""
UPDATE jobs SET state = 'running', attempts = attempts + 1, locked_at = now()
WHERE id = (
    SELECT id FROM jobs
    WHERE state = 'pending' AND run_at <= now()
    ORDER BY run_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
{_CLAIMED}
"""

#: The version the doc warns about: every worker locks the same oldest row and the rest wait.
CLAIM_ONE_NO_SKIP = CLAIM_ONE.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE")

# ARRAY(subquery) is an InitPlan: the selection runs once, so the UPDATE touches exactly the rows
# the LIMIT kept.
CLAIM_BATCH = f"""
UPDATE jobs SET state = 'running', attempts = attempts + 1, locked_at = now()
WHERE id = ANY(ARRAY(
    SELECT id FROM jobs
    WHERE state = 'pending' AND run_at <= now()
    ORDER BY run_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
))
{_CLAIMED}
"""

COMPLETE_ONE = "DELETE FROM jobs WHERE id = %s"
COMPLETE_MANY = "DELETE FROM jobs WHERE id = ANY(%s)"

FAIL = """
UPDATE jobs SET
    state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
    run_at = CASE WHEN attempts >= max_attempts THEN run_at
             ELSE now() + least(power(2, attempts), 3600) * interval '1 second' END,
    locked_at = NULL,
    last_error = left(%s, 500)
WHERE id = %s
"""

REAP = """
UPDATE jobs SET state = 'pending', locked_at = NULL
WHERE state = 'running' AND locked_at < now() - interval '5 minutes'
"""

Handler = Callable[[dict[str, Any]], None]
Claimed = tuple[int, str, dict[str, Any], int, int]


def _noop(payload: dict[str, Any]) -> None:
    return None


HANDLERS: dict[str, Handler] = {"ping": _noop}


def create_schema(conninfo: str) -> None:
    """Create the baseline's ``jobs`` table and its partial index."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(SCHEMA)


def insert_one(conn: psycopg.Connection[Any], kind: str, payload: dict[str, Any]) -> int:
    """One job, one transaction: the doc's INSERT-with-NOTIFY CTE, then COMMIT."""
    row = conn.execute(INSERT_ONE, (kind, json.dumps(payload), 0, 5)).fetchone()
    conn.commit()
    assert row is not None
    return int(row[0])


def insert_many(
    conn: psycopg.Connection[Any], kind: str, payloads: Iterable[dict[str, Any]]
) -> None:
    """Many jobs in one transaction, each through the doc's INSERT (pipelined by ``executemany``)."""
    with conn.cursor() as cur:
        cur.executemany(INSERT_ONE, [(kind, json.dumps(p), 0, 5) for p in payloads])
    conn.commit()


def copy_jobs(conn: psycopg.Connection[Any], kind: str, payloads: Iterable[dict[str, Any]]) -> None:
    """Bulk insert through COPY, with one NOTIFY, in one transaction."""
    with conn.cursor() as cur:
        with cur.copy("COPY jobs (kind, payload) FROM STDIN") as copy:
            for p in payloads:
                copy.write_row((kind, json.dumps(p)))
        cur.execute("SELECT pg_notify('jobs', '')")
    conn.commit()


def run_job(row: Claimed, handlers: dict[str, Handler] = HANDLERS) -> None:
    """Dispatch one claimed job to its handler (a flat map from kind to function)."""
    handler = handlers.get(row[1])
    if handler is None:
        raise LookupError(f"unknown kind {row[1]!r}")
    handler(row[2])


def claim_loop(
    conninfo: str,
    stop: threading.Event,
    *,
    batched: bool,
    counts: list[int],
    slot: int,
    poll: float = 0.05,
) -> None:
    """One worker loop on its own connection: claim (one row, or up to :data:`BATCH`), run, delete.

    Counts finished jobs into ``counts[slot]``; idles ``poll`` seconds when nothing is claimable.
    """
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not stop.is_set():
            if batched:
                rows: list[Any] = conn.execute(CLAIM_BATCH, (BATCH,)).fetchall()
                if not rows:
                    stop.wait(poll)
                    continue
                for row in rows:
                    run_job(row)
                conn.execute(COMPLETE_MANY, ([r[0] for r in rows],))
                counts[slot] += len(rows)
            else:
                one = conn.execute(CLAIM_ONE).fetchone()
                if one is None:
                    stop.wait(poll)
                    continue
                run_job(one)
                conn.execute(COMPLETE_ONE, (one[0],))
                counts[slot] += 1


class Loops:
    """``n`` claim loops in threads, each on its own connection, until :meth:`stop`."""

    def __init__(self, conninfo: str, n: int, *, batched: bool) -> None:
        self.stop_event = threading.Event()
        self.counts = [0] * n
        self.threads = [
            threading.Thread(
                target=claim_loop,
                args=(conninfo, self.stop_event),
                kwargs={"batched": batched, "counts": self.counts, "slot": i},
                name=f"baseline-loop-{i}",
                daemon=True,
            )
            for i in range(n)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self, timeout: float = 10.0) -> int:
        """Stop every loop; return the number of jobs they finished."""
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout)
        return sum(self.counts)


class ListenWorker(threading.Thread):
    """The doc's LISTEN/NOTIFY worker: a standalone LISTEN connection wakes one claim loop, which
    claims until the queue is empty; polling every ``poll`` seconds is the floor."""

    def __init__(
        self, conninfo: str, *, poll: float = 10.0, handlers: dict[str, Handler] = HANDLERS
    ) -> None:
        super().__init__(name="baseline-listen", daemon=True)
        self._conninfo = conninfo
        self._handlers = handlers
        self._poll = poll
        self._stop_event = threading.Event()
        self.listening = threading.Event()
        self.done = 0

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        with (
            psycopg.connect(self._conninfo, autocommit=True) as listen,
            psycopg.connect(self._conninfo, autocommit=True) as work,
        ):
            listen.execute(f"LISTEN {CHANNEL}")
            self.listening.set()
            next_poll = time.monotonic() + self._poll
            wake = True
            while not self._stop_event.is_set():
                if wake or time.monotonic() >= next_poll:
                    while (row := work.execute(CLAIM_ONE).fetchone()) is not None:
                        run_job(row, self._handlers)
                        work.execute(COMPLETE_ONE, (row[0],))
                        self.done += 1
                    next_poll = time.monotonic() + self._poll
                # Short slices so stop() is prompt; a notification ends the wait at once.
                wake = any(True for _ in listen.notifies(timeout=0.25, stop_after=1))
