"""What the rate limit tests share: every claim's time by the database's clock, recorded by a
trigger on the job table (the claim's ``now()``, the time the limit is kept on), and the check
that no window of ``per`` holds more than ``limit`` of them."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta

from sqlalchemy import Engine, text

from sqla_jobs import Worker
from tests._waiting import DEADLINE, wait_until

_CREATE = """
CREATE TABLE IF NOT EXISTS test_claims (id bigint, kind text, rate_key text, at timestamptz);
TRUNCATE test_claims;
CREATE OR REPLACE FUNCTION test_record_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_claims VALUES (NEW.id, NEW.kind, NEW.rate_key, now());
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS test_record_claim ON sqla_jobs_job;
CREATE TRIGGER test_record_claim AFTER UPDATE OF state ON sqla_jobs_job FOR EACH ROW
    WHEN (OLD.state = 'pending' AND NEW.state = 'running') EXECUTE FUNCTION test_record_claim();
"""
_DROP = "DROP TRIGGER IF EXISTS test_record_claim ON sqla_jobs_job"


@contextlib.contextmanager
def recorded_claims(engine: Engine) -> Iterator[None]:
    """Record every claim in ``test_claims`` while inside."""
    with engine.begin() as conn:
        conn.execute(text(_CREATE))
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text(_DROP))


def claims(engine: Engine) -> dict[str, list[datetime]]:
    """Each rate key's claim times (a job without one under its kind), ascending."""
    out: dict[str, list[datetime]] = defaultdict(list)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT coalesce(rate_key, kind), at FROM test_claims ORDER BY at")
        )
        for key, at in rows:
            out[key].append(at)
    return dict(out)


def claim_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM test_claims")).scalar_one())


def busiest_window(starts: list[datetime], per: timedelta) -> int:
    """The most of ``starts`` in any window of length ``per`` (half-open, as the limit counts)."""
    ordered = sorted(starts)
    best = 0
    for i, first in enumerate(ordered):
        best = max(best, sum(1 for t in ordered[i:] if t < first + per))
    return best


def listening(workers: list[Worker]) -> None:
    """Wait until every worker's listener is connected (else a NOTIFY sent now would be missed,
    and a job enqueued after the start would wait for the poll)."""
    for worker in workers:

        def started(w: Worker = worker) -> bool:
            return w.listener is not None

        wait_until(started, "the listener started")
        assert worker.listener is not None
        assert worker.listener.connected.wait(DEADLINE), "the listener did not connect"
