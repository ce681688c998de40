"""An enqueuer process for the unique-jobs race test: run under ``multiprocessing`` (spawn)."""

from __future__ import annotations

import random

from pydantic import BaseModel
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import Jobs, Unique


class Touch(BaseModel):
    key: int
    by: int


JOBS = Jobs()
JOBS.register("touch", Touch, unique=Unique(by=("key",)))


def enqueue_rounds(url: str, seed: int, keys: int, rounds: int) -> tuple[set[int], int]:
    """Enqueue random keys in ``rounds`` transactions, a third of them rolled back, alternating
    single enqueues (in the order of their keys' text) and shuffled ``enqueue_many`` batches. Returns the keys this
    process committed (inserted or found) and how many of its enqueues inserted a job."""
    rng = random.Random(seed)
    engine = create_engine(url, poolclass=NullPool)
    committed: set[int] = set()
    inserted = 0
    try:
        for n in range(rounds):
            chosen = rng.sample(range(keys), rng.randint(1, min(8, keys)))
            with Session(engine) as session:
                session.begin()
                if n % 2:
                    rng.shuffle(chosen)
                    ids = JOBS.enqueue_many(session, [Touch(key=k, by=seed) for k in chosen])
                    new = sum(ids.inserted)
                else:
                    new = sum(
                        bool(JOBS.enqueue(session, Touch(key=k, by=seed)).inserted)
                        # In the order enqueue_many takes keys (their text): the same lock order.
                        for k in sorted(chosen, key=str)
                    )
                if rng.random() < 1 / 3:
                    session.rollback()
                else:
                    session.commit()
                    committed.update(chosen)
                    inserted += new
    finally:
        engine.dispose()
    return committed, inserted
