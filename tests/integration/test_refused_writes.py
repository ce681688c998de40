"""A batch of outcomes the server refuses (an application's foreign key to a job) is written one
outcome at a time, and the lane it failed on keeps working: every later claim and completion on it
succeeds.

psycopg records a statement as prepared when it sends the statement's Parse. In a pipeline that an
earlier statement aborted, the server skips that Parse, and every later execution of the statement
on that connection fails with ``prepared statement "_pg3_N" does not exist``. The claim and the
completion are prepared at their sixth execution on a connection, so a refused batch among a
lane's first round trips would leave it unable to claim (the worker stops taking jobs) or to delete
completed jobs (each one is then kept as ``completed``).
"""

from __future__ import annotations

import threading

from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs
from tests._waiting import DEADLINE, wait_until
from tests.integration._workers import running_workers

JOBS = 12
#: The positions, in claim order, of the jobs an application's row points at: every round trip
#: from the third to the ninth carries a refused completion, so whichever of them prepares the
#: claim or a completion, the statement's Parse lands in an aborted pipeline.
REFERENCED = range(2, 8)


class Note(BaseModel):
    n: int


def test_a_lane_keeps_claiming_and_deleting_after_batches_the_server_refused(
    clean: Engine, migrated_url: str
) -> None:
    jobs = Jobs()
    ran: list[int] = []
    lock = threading.Lock()

    @jobs.kind("refused_write_note", Note)
    async def note(payload: Note, ctx: JobContext) -> None:
        with lock:
            ran.append(ctx.job_id)

    with clean.begin() as conn:
        conn.execute(text("CREATE TABLE app_note (job_id bigint REFERENCES sqla_jobs_job (id))"))
    try:
        with Session(clean) as session:
            ids = jobs.enqueue_many(session, [Note(n=i) for i in range(JOBS)])
            referenced = [ids[i] for i in REFERENCED]
            for job_id in referenced:
                session.execute(text("INSERT INTO app_note VALUES (:id)"), {"id": job_id})
            session.commit()
        # One job per claim and one outcome per write: each round trip of the lane carries
        # exactly one completion and one claim, so the executions of each statement are counted.
        with running_workers(jobs, migrated_url, concurrency=1, prefetch=0, poll_interval=0.05):
            wait_until(lambda: len(ran) >= JOBS, "every job run", timeout=DEADLINE)
            wait_until(
                lambda: _left(clean) == {i: "completed" for i in referenced},
                "only the referenced jobs left, kept as completed",
            )
        assert sorted(ran) == ids
        assert _left(clean) == {i: "completed" for i in referenced}
    finally:
        with clean.begin() as conn:
            conn.execute(text("DROP TABLE app_note"))


def _left(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, state FROM sqla_jobs_job")).all()
    return {int(r.id): str(r.state) for r in rows}
