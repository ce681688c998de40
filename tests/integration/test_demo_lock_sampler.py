"""The demo's lock sampler tells a claim waiting on a row lock (what SKIP LOCKED spares it) from
every other lock wait, which it names.

Its step 4 once reported a lock wait during a drain that no claim had made: it counted every
session waiting on any lock. A later run showed one on a row: an outcome write can wait a moment
for the worker's own heartbeat, which holds the running job's row while it renews the lease.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, select, text

from demo.tour import CLAIMS_WAITING, OTHER_WAITS
from tests._waiting import wait_until

KEY = 731_205


@pytest.fixture
def probe(engine: Engine) -> Iterator[Engine]:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE demo_lock_probe (id int PRIMARY KEY, state text)"))
        conn.execute(text("INSERT INTO demo_lock_probe VALUES (1, 'pending'), (2, 'running')"))
    yield engine
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE demo_lock_probe"))


def _waits(engine: Engine) -> int:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
    return int(found)


def _blocked(engine: Engine, statement: str) -> threading.Thread:
    def run() -> None:
        with engine.begin() as conn:
            conn.execute(text(statement))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_claim_on_a_locked_row_is_counted_and_other_waits_are_named(probe: Engine) -> None:
    with probe.connect() as holder:
        tx = holder.begin()
        holder.execute(text("SELECT id FROM demo_lock_probe FOR UPDATE"))
        holder.execute(text(f"SELECT pg_advisory_xact_lock({KEY})"))
        waiters = [
            # A claim without SKIP LOCKED: it sets its row running, and waits.
            _blocked(probe, "UPDATE demo_lock_probe SET state='running' WHERE id = 1"),
            # An outcome write waiting for the row's holder (the heartbeat, in a worker).
            _blocked(probe, "DELETE FROM demo_lock_probe WHERE id = 2"),
            _blocked(probe, f"SELECT pg_advisory_xact_lock({KEY})"),
        ]
        wait_until(lambda: _waits(probe) == 3, "the three sessions waiting on their locks")
        with probe.connect() as sampler:
            claims, others = _sample(sampler)
        tx.rollback()
    for waiter in waiters:
        waiter.join(10)
    assert claims == 1
    assert sorted((others or "").split("; ")) == [
        f"advisory: SELECT pg_advisory_xact_lock({KEY})",
        "transactionid: DELETE FROM demo_lock_probe WHERE id = 2",
    ]


def test_no_lock_wait_samples_as_zero_and_none(probe: Engine) -> None:
    with probe.connect() as conn:
        assert _sample(conn) == (0, None)


def _sample(conn: Connection) -> tuple[int, str | None]:
    row = conn.execute(select(CLAIMS_WAITING, OTHER_WAITS)).one()
    return int(row[0]), row[1]
