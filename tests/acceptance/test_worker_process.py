"""Real worker processes, killed and stopped the ways production stops them.

Workers run ``python -m sqla_jobs.cli worker tests.acceptance.app:jobs``; what their handlers did is
read from ``acceptance_effects`` and the queue tables, never from the processes themselves.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs.worker.heap import YOUNG_THRESHOLD
from tests.acceptance._processes import DEADLINE, WorkerProcess, wait_until
from tests.acceptance.app import EFFECTS_TABLE, ExitProcess, Heap, Work, jobs

#: Short leases, so a dead worker's job is rescued within seconds.
RESCUE = ("--lease", "2", "--heartbeat", "0.5", "--poll-interval", "0.2", "--keep-history")

Spawn = Callable[..., WorkerProcess]


def enqueue(engine: Engine, *payloads: BaseModel) -> list[int]:
    with Session(engine) as session:
        ids = jobs.enqueue_many(session, payloads)
        session.commit()
    return ids


def effects_of(engine: Engine, job_id: int | None = None) -> list[tuple[Any, ...]]:
    """(event, attempt, crashes, pid) rows, in the order they were committed."""
    where = "" if job_id is None else f"WHERE job_id = {int(job_id)}"
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    f"SELECT event, attempt, crashes, pid FROM {EFFECTS_TABLE} {where} ORDER BY seq"
                )
            )
        ]


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def history_of(engine: Engine, job_id: int) -> tuple[Any, ...] | None:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT attempts, crashes FROM sqla_jobs_history WHERE id = :id"), {"id": job_id}
        ).first()
    return None if found is None else tuple(found)


def assert_rescued(effects: Engine, job_id: int, first: WorkerProcess, spawn: Spawn) -> None:
    """A second worker reaps the dead worker's job and completes it, as a crash, not a failure."""
    left = scalar(effects, "SELECT state FROM sqla_jobs_job WHERE id = :id", id=job_id)
    assert left == "running", "the dead worker's lease is still on the job"
    second = spawn(*RESCUE)
    history = wait_until(lambda: history_of(effects, job_id), "the job is rescued and completed")
    # Two claims: the one that died with its worker (a crash) and the one that completed. No
    # handler failure was counted (failures = attempts - crashes, less the successful run).
    assert history == (2, 1)
    pids = (first.proc.pid, second.proc.pid)
    assert effects_of(effects, job_id) == [
        ("started", 1, 0, pids[0]),
        ("started", 2, 1, pids[1]),
        ("finished", 2, 1, pids[1]),
    ]
    assert "event=reaped" in second.log
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(DEADLINE) == 0


def test_a_job_whose_worker_is_sigkilled_is_reaped_and_completed_by_another_worker(
    effects: Engine, spawn_worker: Spawn
) -> None:
    (job_id,) = enqueue(effects, Work(tag="kill", first_run_seconds=120))
    first = spawn_worker(*RESCUE)
    wait_until(lambda: effects_of(effects, job_id), "the handler is running")
    assert scalar(effects, "SELECT state FROM sqla_jobs_job WHERE id = :id", id=job_id) == "running"
    first.proc.kill()
    assert first.proc.wait(DEADLINE) == -signal.SIGKILL
    assert_rescued(effects, job_id, first, spawn_worker)


def test_a_handler_that_ends_its_process_is_rerun_by_another_worker_as_a_crash(
    effects: Engine, spawn_worker: Spawn
) -> None:
    (job_id,) = enqueue(effects, ExitProcess(tag="exit", code=17))
    first = spawn_worker(*RESCUE)
    assert first.proc.wait(DEADLINE) == 17, first.log
    assert_rescued(effects, job_id, first, spawn_worker)


def test_sigterm_lets_jobs_in_flight_finish_and_exits_0(
    effects: Engine, spawn_worker: Spawn
) -> None:
    ids = enqueue(effects, *(Work(tag=f"t{i}", seconds=2.0) for i in range(6)))
    worker = spawn_worker("--concurrency", "4", "--poll-interval", "0.2")
    wait_until(lambda: len(effects_of(effects)) >= 4, "four handlers running", timeout=DEADLINE)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(DEADLINE) == 0, worker.log
    log = worker.log
    assert "event=stopping" in log
    assert "event=stopped" in log
    done = effects_of(effects)
    started = [e for e in done if e[0] == "started"]
    finished = [e for e in done if e[0] == "finished"]
    assert len(started) >= 4
    assert len(finished) == len(started), "every job in flight finished"
    with effects.connect() as conn:
        left = conn.execute(text("SELECT state, attempts FROM sqla_jobs_job")).all()
    # Jobs prefetched but never started were given back (attempts restored); none in flight was.
    assert [tuple(r) for r in left] == [("pending", 0)] * (len(ids) - len(finished))


def test_a_second_sigterm_exits_at_once_with_130(effects: Engine, spawn_worker: Spawn) -> None:
    (job_id,) = enqueue(effects, Work(tag="long", seconds=120))
    worker = spawn_worker("--poll-interval", "0.2")
    wait_until(lambda: effects_of(effects, job_id), "the long handler is running")
    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_logged("stopping")
    assert worker.proc.poll() is None, "the first SIGTERM waits for the running job"
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(DEADLINE) == 130, worker.log
    assert "event=forced" in worker.log
    # Forced out: the lease is left to expire and be reaped, not given back.
    assert scalar(effects, "SELECT state FROM sqla_jobs_job WHERE id = :id", id=job_id) == "running"


def test_the_worker_process_freezes_its_startup_heap_and_collects_less_often(
    effects: Engine, spawn_worker: Spawn
) -> None:
    # `sqla-jobs worker` owns its process: the objects of its startup (modules, the application,
    # SQLAlchemy and pydantic state) are left out of the garbage collector's walks, and the jobs
    # it holds no longer start young collections.
    (job_id,) = enqueue(effects, Heap(tag="heap"))
    worker = spawn_worker("--poll-interval", "0.2")
    (row,) = wait_until(lambda: effects_of(effects, job_id), "the handler ran")
    frozen, young = row[0].split()
    assert int(frozen.removeprefix("frozen=")) > 10_000, row
    assert young == f"young={YOUNG_THRESHOLD}", row
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(DEADLINE) == 0, worker.log
