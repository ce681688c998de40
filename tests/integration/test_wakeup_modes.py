"""When an enqueue wakes the workers, in each mode of ``Jobs(wakeup=...)``: never before the
commit, never after a rollback (savepoints included), once after the commit; the notifier's
NOTIFY leaves the enqueuing transaction; polling still finds jobs when the notifier is cut off."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs import ConfigurationError, JobContext, Jobs
from sqla_jobs.db.urls import sqlalchemy_url, with_database
from sqla_jobs.enqueue import notifier as _notifier
from sqla_jobs.enqueue import wakeup as _notify
from tests._waiting import DEADLINE

from ._listening import ARRIVES, QUIET, Heard
from ._workers import running_workers, wait_until


class Ping(BaseModel):
    n: int = 0


class Counted(BaseModel):
    n: int


def make_jobs(mode: Any = "after_commit") -> Jobs:
    jobs = Jobs(wakeup=mode)

    @jobs.kind("ping", Ping)
    def ping(args: Ping, ctx: JobContext) -> None:
        pass

    return jobs


def in_transaction_notifies(engine: Engine) -> list[str]:
    """Start recording the statements of ``engine`` that carry a ``pg_notify``."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "pg_notify" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    return seen


def test_after_commit_sends_nothing_before_the_commit_and_one_wakeup_after_it(
    clean: Engine, heard: Heard
) -> None:
    jobs = make_jobs()
    sent = in_transaction_notifies(clean)
    with Session(clean) as session:
        jobs.enqueue(session, Ping(n=1))
        jobs.enqueue(session, Ping(n=2))
        jobs.enqueue_many(session, [Ping(n=n) for n in range(100)])
        session.flush()
        assert heard.within(QUIET) == []
        session.commit()
    assert heard.within(ARRIVES) == ["default"]
    assert sent == [], "the enqueuing transaction carried a NOTIFY"


def test_after_commit_sends_nothing_after_a_rollback(clean: Engine, heard: Heard) -> None:
    jobs = make_jobs()
    with Session(clean) as session:
        jobs.enqueue(session, Ping())
        jobs.enqueue_many(session, [Ping(), Ping()], queue="other")
        session.rollback()
        jobs.enqueue(session, Ping(), queue="third")
    # Closed without a commit: nothing either.
    assert heard.within(QUIET) == []
    # A commit of the next transaction does not send the rolled-back ones.
    with Session(clean) as session:
        session.execute(text("SELECT 1"))
        session.commit()
    assert heard.within(QUIET) == []


def test_a_rolled_back_savepoint_drops_its_wakeups_and_a_released_one_keeps_them(
    clean: Engine, heard: Heard
) -> None:
    jobs = make_jobs()
    with Session(clean) as session:
        with session.begin_nested() as kept:
            jobs.enqueue(session, Ping(), queue="kept")
            kept.commit()
        nested = session.begin_nested()
        jobs.enqueue(session, Ping(), queue="dropped")
        with session.begin_nested():
            jobs.enqueue(session, Ping(), queue="dropped-inner")
        nested.rollback()
        # A released savepoint is no commit: nothing sent yet.
        assert heard.within(QUIET) == []
        session.commit()
    assert heard.within(ARRIVES) == ["kept"]


def test_a_session_joined_to_a_callers_transaction_wakes_only_when_that_commits(
    clean: Engine, heard: Heard
) -> None:
    jobs = make_jobs()
    with clean.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            jobs.enqueue(session, Ping())
            session.commit()  # releases the Session's savepoint; the real transaction is open
        assert heard.within(QUIET) == []
        outer.commit()
    assert heard.within(ARRIVES) == ["default"]
    with clean.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            jobs.enqueue(session, Ping())
            session.commit()
        outer.rollback()
    assert heard.within(QUIET) == []


def test_in_transaction_wakes_at_commit_never_after_rollback_and_throttles_per_queue(
    clean: Engine, heard: Heard, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = make_jobs("in_transaction")
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="rolled-back")
        session.rollback()
    assert heard.within(QUIET) == []
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="q2")
        assert heard.within(QUIET) == []
        session.commit()
    assert heard.within(ARRIVES) == ["q2"]
    # Two transactions within the throttle: one wakeup (the worker it woke claims both). The
    # throttle is stretched so that a loaded machine cannot space them past it.
    monkeypatch.setattr(_notify, "THROTTLE", 30.0)
    for _ in range(2):
        with Session(clean) as session:
            jobs.enqueue(session, Ping(), queue="q1")
            session.commit()
    assert heard.within(QUIET) == ["q1"]
    monkeypatch.undo()
    # Past the throttle's real length: waiting out a duration is the point here.
    time.sleep(_notify.THROTTLE * 1.5)
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="q1")
        session.commit()
    assert heard.within(ARRIVES) == ["q1"]


def test_none_sends_no_wakeup(clean: Engine, heard: Heard) -> None:
    jobs = make_jobs("none")
    with Session(clean) as session:
        jobs.enqueue(session, Ping())
        jobs.enqueue_many(session, [Ping()] * 100)
        session.commit()
    assert heard.within(QUIET) == []


@pytest.mark.parametrize("mode", ["after_commit", "in_transaction"])
def test_a_job_not_due_yet_wakes_no_one_and_one_due_now_does(
    clean: Engine, heard: Heard, mode: str
) -> None:
    jobs = make_jobs(mode)
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), delay=timedelta(seconds=30))
        jobs.enqueue(session, Ping(), run_at=datetime.now(timezone.utc) + timedelta(hours=1))
        jobs.enqueue_many(session, [Ping()] * 100, delay=5)
        session.commit()
    # No claim now: at most (after_commit) the time the first becomes due.
    expected = [] if mode == "in_transaction" else ["due"]
    assert [p.split()[0] for p in heard.within(QUIET)] == expected
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), run_at=datetime.now(timezone.utc) - timedelta(seconds=1))
        session.commit()
    assert heard.within(ARRIVES) == ["default"]


def test_an_async_session_wakes_after_its_commit_and_not_for_a_rolled_back_savepoint(
    migrated_url: str, clean: Engine, heard: Heard
) -> None:
    jobs = make_jobs()

    async def scenario() -> list[str]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session:
                await jobs.enqueue_async(session, Ping(), queue="async")
                nested = await session.begin_nested()
                await jobs.enqueue_many_async(session, [Ping()], queue="async-dropped")
                await nested.rollback()
                quiet = heard.within(QUIET)
                await session.commit()
                return quiet
        finally:
            await engine.dispose()

    assert asyncio.run(scenario()) == []
    assert heard.within(ARRIVES) == ["async"]


def _enqueue_in_child(url: str) -> None:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with Session(engine) as session:
        make_jobs().enqueue(session, Ping(), queue="child")
        session.commit()
    # multiprocessing ends a child with os._exit (no atexit): flush as a long-lived one would.
    assert _notifier.flush_all(DEADLINE)
    engine.dispose()


def test_a_forked_child_gets_its_own_notifier_and_leaves_the_parents_working(
    migrated_url: str, clean: Engine, heard: Heard
) -> None:
    jobs = make_jobs()
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="parent")
        session.commit()
    assert heard.within(ARRIVES) == ["parent"]
    child = multiprocessing.get_context("fork").Process(
        target=_enqueue_in_child, args=(migrated_url,)
    )
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert heard.within(ARRIVES) == ["child"]
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="parent-again")
        session.commit()
    assert heard.within(ARRIVES) == ["parent-again"]


def notifier_pids(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.scalars(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE 'sqla-jobs notifier %'"
                )
            )
        )


def test_a_killed_notifier_connection_reconnects_for_the_next_wakeup(
    clean: Engine, heard: Heard
) -> None:
    jobs = make_jobs()
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="before")
        session.commit()
    assert heard.within(ARRIVES) == ["before"]
    with clean.connect() as conn:
        for pid in notifier_pids(clean):
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="after")
        session.commit()
    assert heard.within(ARRIVES) == ["after"]


def test_jobs_are_still_picked_up_by_polling_when_the_notifier_cannot_connect(
    clean: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = make_jobs()
    done: list[int] = []

    @jobs.kind("counted", Counted)
    def counted(args: Counted, ctx: JobContext) -> None:
        done.append(args.n)

    database = clean.url.database
    with running_workers(jobs, migrated_url, poll_interval=0.3) as (worker,):
        wait_until(lambda: worker.listener is not None and worker.listener.connected.is_set())
        with Session(clean) as session:
            jobs.enqueue(session, Ping(n=1))  # the notifier is connected now
            session.commit()
        assert _notifier.flush_all(DEADLINE)
        # From another database: PostgreSQL refuses to close the one it is connected to.
        server = create_engine(sqlalchemy_url(with_database(migrated_url, "postgres")))
        with server.connect() as admin:
            # The Session below takes the pooled connection the enqueue above left open.
            admin.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false'))
            admin.commit()
            try:
                for pid in notifier_pids(clean):
                    admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                admin.commit()
                with caplog.at_level(logging.WARNING, logger="sqla_jobs.enqueue.insert"):
                    with Session(clean) as session:
                        jobs.enqueue(session, Counted(n=2))
                        session.commit()
                    wait_until(lambda: 2 in done, what="the job found by polling")
                    # The notifier's attempts are paced (RETRY): its failure may come after.
                    wait_until(
                        lambda: any(
                            getattr(r, "event", None) == "notifier_failed" for r in caplog.records
                        ),
                        what="the notifier's failure logged",
                    )
            finally:
                admin.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true'))
                admin.commit()
        server.dispose()


def test_an_unknown_wakeup_mode_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="wakeup must be one of"):
        Jobs(wakeup="sometimes")  # type: ignore[arg-type]


def test_a_process_enqueueing_continuously_sends_at_most_one_statement_per_interval(
    clean: Engine, heard: Heard
) -> None:
    """Every queue is woken, and the NOTIFY transactions the process adds stay within
    1 / INTERVAL a second, however fast it commits."""
    jobs = make_jobs()
    with Session(clean) as session:  # the notifier connected and idle
        jobs.enqueue(session, Ping(), queue="warm")
        session.commit()
    assert heard.within(ARRIVES) == ["warm"]
    assert _notifier.flush_all(DEADLINE)
    notifier = _notifier.notifier(_notify._conninfo(clean))
    sent_before = notifier.sent
    started = time.monotonic()
    queues = [f"q{n}" for n in range(40)]
    for queue in queues:
        with Session(clean) as session:
            jobs.enqueue(session, Ping(), queue=queue)
            session.commit()
    assert _notifier.flush_all(DEADLINE)
    elapsed = time.monotonic() - started
    got: list[str] = []
    while len(got) < len(queues) and (more := heard.within(ARRIVES)):
        got += more
    assert sorted(got) == sorted(queues)
    statements = notifier.sent - sent_before
    assert 1 <= statements <= 1 + elapsed / _notifier.INTERVAL + 1, (statements, elapsed)


def test_the_queues_of_one_commit_are_woken_by_one_statement(clean: Engine, heard: Heard) -> None:
    jobs = make_jobs()
    notifier = _notifier.notifier(_notify._conninfo(clean))
    assert _notifier.flush_all(DEADLINE)
    time.sleep(_notifier.INTERVAL)  # past the interval of earlier sends
    before = notifier.sent
    with Session(clean) as session:
        jobs.enqueue_many(session, [Ping()] * 3, queue="a")
        jobs.enqueue(session, Ping(), queue="b")
        jobs.enqueue(session, Ping(), queue="c")
        session.commit()
    assert _notifier.flush_all(DEADLINE)
    assert sorted(heard.within(ARRIVES)) == ["a", "b", "c"]
    assert notifier.sent - before == 1


def test_a_notifier_whose_thread_ended_is_replaced_at_the_next_commit(
    clean: Engine, heard: Heard
) -> None:
    jobs = make_jobs()
    conninfo = _notify._conninfo(clean)
    ended = _notifier.notifier(conninfo)
    ended.stop()
    ended.join(DEADLINE)
    assert ended.ended
    assert not ended.is_alive()
    with Session(clean) as session:
        jobs.enqueue(session, Ping(), queue="after")
        session.commit()
    assert heard.within(ARRIVES) == ["after"]
    assert _notifier.notifier(conninfo) is not ended
