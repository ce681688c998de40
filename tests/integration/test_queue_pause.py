"""A queue's pause through the API: a typo is refused when asked (``known_only``), a re-pause and a
resume of an active queue say they changed nothing, a queue's row can be forgotten, and which
queues count as known."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Jobs, QueueInUseError, UnknownQueueError


@pytest.fixture
def queues(clean: Engine) -> Iterator[Engine]:
    """:func:`clean` with no queue row, worker, schedule or throughput minute, before and after
    (``clean`` keeps these tables, and a pause left behind would stop other tests' workers)."""
    wipe = "TRUNCATE sqla_jobs_queue, sqla_jobs_worker, sqla_jobs_schedule, sqla_jobs_throughput"
    with clean.begin() as conn:
        conn.execute(text(wipe))
    yield clean
    with clean.begin() as conn:
        conn.execute(text(wipe))


def run(engine: Engine, sql: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql))


def add_job(engine: Engine, queue: str, state: str = "pending", key: str | None = None) -> int:
    lease = "gen_random_uuid(), now() + interval '1 minute'" if state == "running" else "NULL, NULL"
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO sqla_jobs_job (queue, kind, payload, state, concurrency_key, "
                    "concurrency_limit, lease_token, lease_expires_at, finished_at) VALUES "
                    f"(:queue, 'k', '{{}}', :state, :key, :limit, {lease}, "
                    "CASE WHEN :state IN ('dead', 'cancelled') THEN now() END) RETURNING id"
                ),
                {"queue": queue, "state": state, "key": key, "limit": 1 if key else None},
            ).scalar_one()
        )


def stored(engine: Engine) -> dict[str, bool]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT queue, paused_at IS NOT NULL FROM sqla_jobs_queue"))
        return {queue: paused for queue, paused in rows}


def test_known_only_refuses_a_queue_nothing_names_and_the_transaction_stays_usable(
    queues: Engine,
) -> None:
    jobs = Jobs()
    add_job(queues, "mail")
    with Session(queues) as session, session.begin():
        with pytest.raises(UnknownQueueError) as caught:
            jobs.pause_queue(session, "mial", known_only=True)
        assert caught.value.known == ["mail"]
        assert "known queues: mail" in str(caught.value)
        assert jobs.pause_queue(session, "mail", known_only=True).changed
    assert stored(queues) == {"mail": True}


def test_a_queue_can_still_be_paused_before_its_first_job(queues: Engine) -> None:
    jobs = Jobs()
    with Session(queues) as session, session.begin():
        change = jobs.pause_queue(session, "later")
    assert change.changed
    assert change.paused_at is not None
    assert stored(queues) == {"later": True}


def test_a_repause_keeps_its_first_time_and_a_resume_of_an_active_queue_stores_nothing(
    queues: Engine,
) -> None:
    jobs = Jobs()
    with Session(queues) as session, session.begin():
        first = jobs.pause_queue(session, "mail")
    with Session(queues) as session, session.begin():
        again = jobs.pause_queue(session, "mail")
        other = jobs.resume_queue(session, "never")
    assert (again.changed, again.paused_at) == (False, first.paused_at)
    assert not other.changed
    with Session(queues) as session, session.begin():
        assert jobs.resume_queue(session, "mail").changed
        assert not jobs.resume_queue(session, "mail").changed
    assert stored(queues) == {"mail": False}


def test_known_queues_are_those_of_jobs_in_use_schedules_live_workers_and_stored_rows(
    queues: Engine,
) -> None:
    jobs = Jobs()
    add_job(queues, "pending")
    add_job(queues, "keyed", key="k1")
    add_job(queues, "running", state="running")
    add_job(queues, "old-dead", state="dead")
    last = add_job(queues, "scheduled", state="dead")
    run(
        queues,
        f"INSERT INTO sqla_jobs_schedule (name, kind, spec, last_job_id) VALUES "
        f"('nightly', 'k', 'every 1d', {last})",
    )
    run(
        queues,
        "INSERT INTO sqla_jobs_throughput (minute, queue, kind, completed) VALUES "
        "(date_trunc('minute', now()), 'finished', 'k', 1), "
        "(now() - interval '8 days', 'long-ago', 'k', 1)",
    )
    run(
        queues,
        "INSERT INTO sqla_jobs_worker (name, host, pid, queues, concurrency, expires_at) "
        "VALUES ('w1', 'h', 1, ARRAY['served', 'pending'], 4, now() + interval '1 minute'), "
        "('w2', 'h', 2, ARRAY['gone'], 4, now() - interval '1 second')",
    )
    with Session(queues) as session, session.begin():
        jobs.pause_queue(session, "ahead")
        assert jobs.known_queues(session) == [
            "ahead",
            "finished",
            "keyed",
            "pending",
            "running",
            "scheduled",
            "served",
        ]


def test_forget_deletes_the_row_and_refuses_to_resume_a_paused_queue_in_use_unless_forced(
    queues: Engine,
) -> None:
    jobs = Jobs()
    add_job(queues, "mail")
    with Session(queues) as session, session.begin():
        jobs.pause_queue(session, "mail")
        jobs.pause_queue(session, "alpah")
    with Session(queues) as session, session.begin():
        assert jobs.forget_queue(session, "alpah")
        assert not jobs.forget_queue(session, "alpah")
        with pytest.raises(QueueInUseError):
            jobs.forget_queue(session, "mail")
    assert stored(queues) == {"mail": True}
    with Session(queues) as session, session.begin():
        assert jobs.forget_queue(session, "mail", force=True)
    assert stored(queues) == {}
