"""The demo's lock sampler tells a row-lock wait (what SKIP LOCKED spares a claim) from the others.

Its step 4 once reported a lock wait during a drain that no claim had made: it counted every
session waiting on any lock, a relation extension lock of a growing table among them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, select, text

from demo.tour import WAITING_ON_OTHERS, WAITING_ON_ROWS
from tests._waiting import wait_until

KEY = 731_205


@pytest.fixture
def probe(engine: Engine) -> Iterator[Engine]:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE demo_lock_probe (id int PRIMARY KEY, v int)"))
        conn.execute(text("INSERT INTO demo_lock_probe VALUES (1, 0)"))
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


def test_a_row_lock_wait_is_counted_and_an_advisory_one_is_named_apart(probe: Engine) -> None:
    with probe.connect() as holder:
        tx = holder.begin()
        holder.execute(text("UPDATE demo_lock_probe SET v = 1 WHERE id = 1"))
        holder.execute(text(f"SELECT pg_advisory_xact_lock({KEY})"))
        row_waiter = _blocked(probe, "UPDATE demo_lock_probe SET v = 2 WHERE id = 1")
        other_waiter = _blocked(probe, f"SELECT pg_advisory_xact_lock({KEY})")
        wait_until(lambda: _waits(probe) == 2, "both sessions waiting on their lock")
        with probe.connect() as sampler:
            seen = _sample(sampler)
        tx.rollback()
    row_waiter.join(10)
    other_waiter.join(10)
    assert seen == (1, "advisory")


def test_no_lock_wait_samples_as_zero_and_none(probe: Engine) -> None:
    with probe.connect() as conn:
        assert _sample(conn) == (0, None)


def _sample(conn: Connection) -> tuple[int, str | None]:
    row = conn.execute(select(WAITING_ON_ROWS, WAITING_ON_OTHERS)).one()
    return int(row[0]), row[1]
