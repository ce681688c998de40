"""The crash rule in a running worker: when one claim brings two jobs that crashed a worker
before, one of them on its last crash life, the worker keeps one and gives the other back. The
kept job must not start before the give-back is committed: if it crashes the process first, the
job waiting to be given back is still locked by this worker, its lease expires with the
process, and it is charged a crash (on its last life: dead) for a job it never ran beside (the
poison test's healthy job, tests/reliability/test_poison.py)."""

from __future__ import annotations

import threading

from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, Worker
from tests.integration._workers import parked, running_workers, wait_until

QUEUE = "crash_rule"


class Crashed(BaseModel):
    n: int


def test_a_job_kept_by_the_crash_rule_starts_only_after_the_other_is_given_back(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    #: Per run: the job, and the other jobs still running (under a lease) when it started.
    starts: list[tuple[int, list[int]]] = []
    lock = threading.Lock()

    @jobs.kind("crash_rule_probe", Crashed, queue=QUEUE)
    def probe(p: Crashed, ctx: JobContext) -> None:
        with clean.connect() as conn:
            others = conn.execute(
                text("SELECT id FROM sqla_jobs_job WHERE state = 'running' AND id <> :id"),
                {"id": ctx.job_id},
            ).scalars()
            with lock:
                starts.append((ctx.job_id, sorted(others)))

    # A NOTIFY is the only thing that wakes it in time: the claim is the listener's (the
    # hand-off), which starts what it takes without a round trip of the fetch loop.
    with running_workers(
        jobs, migrated_url, queues=[QUEUE], concurrency=2, listen=True, poll_interval=60
    ) as (worker,):
        assert isinstance(worker, Worker)
        wait_until(parked(worker), what="the worker is idle")
        with Session(clean) as s, s.begin():
            ids = [jobs.enqueue(s, Crashed(n=n)).id for n in range(2)]
            # Both crashed a worker twice: each is on its last crash life (max_crashes 3).
            s.execute(
                text("UPDATE sqla_jobs_job SET crashes = 2, attempts = 2 WHERE id = ANY(:ids)"),
                {"ids": ids},
            )
        wait_until(lambda: len(starts) == 2, what="both jobs ran")
        wait_until(lambda: worker.counts["done"] == 2, what="both outcomes written")
    assert sorted(job for job, _ in starts) == ids, "each job ran once"
    assert [others for _, others in starts] == [[], []], (
        f"a job on its last crash life started beside a job still held: {starts}"
    )
    assert worker.counts["released"] == 1, "one of the two was given back by the crash rule"
    with clean.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar()
    assert left == 0, "both completed"
