"""Periodic schedules against a real PostgreSQL: each tick enqueued once however many schedulers
run, missed ticks handled by policy, pause, resume and run-now, and a worker woken at the tick."""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, make_url, text
from sqlalchemy.orm import Session

from sqla_jobs import Jobs, ScheduleNotFoundError, Unique, Worker
from sqla_jobs.db.connections import Connector
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.periodic.scheduler import LOOKAHEAD, RETRY_AFTER, Scheduler
from tests._waiting import DEADLINE, wait_until
from tests.integration._workers import running_workers

UTC = timezone.utc


class Beat(BaseModel):
    pass


class Stamp(BaseModel):
    tick: datetime


class Digest(BaseModel):
    day: str


class Sweep(BaseModel):
    pass


@pytest.fixture
def fresh(clean: Engine) -> Engine:
    """The engine, with the schedule table emptied too."""
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_schedule"))
    return clean


def beat_jobs(**options: object) -> Jobs:
    jobs = Jobs()
    jobs.register("beat", Beat)
    jobs.add_periodic("beat", **options)  # type: ignore[arg-type]
    return jobs


def scheduler(jobs: Jobs, url: str, name: str = "s") -> Scheduler:
    return Scheduler(jobs, Connector(libpq_conninfo(url), name))


@contextlib.contextmanager
def running(schedulers: list[Scheduler]) -> Iterator[list[Scheduler]]:
    for s in schedulers:
        s.start()
    try:
        yield schedulers
    finally:
        for s in schedulers:
            s.stop()
        for s in schedulers:
            s.join(DEADLINE)
            s.engine.dispose()


def ticks(engine: Engine, schedule: str = "beat") -> list[datetime]:
    """The tick of every job the schedule enqueued, in id order."""
    with engine.connect() as conn:
        return [
            datetime.fromisoformat(t)
            for t in conn.execute(
                text(
                    "SELECT meta->>'tick' FROM sqla_jobs_job WHERE meta->>'schedule' = :s ORDER BY id"
                ),
                {"s": schedule},
            ).scalars()
        ]


def schedule_row(engine: Engine, name: str = "beat") -> dict[str, object]:
    with engine.connect() as conn:
        row = (
            conn.execute(text("SELECT * FROM sqla_jobs_schedule WHERE name = :n"), {"n": name})
            .mappings()
            .one()
        )
    return dict(row)


def last_tick(engine: Engine, name: str = "beat") -> object:
    """The schedule's last tick; None also while no scheduler has registered it yet."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT last_tick_at FROM sqla_jobs_schedule WHERE name = :n"), {"n": name}
        ).scalar()


def set_last_tick(engine: Engine, name: str, last: datetime, spec: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_schedule (name, kind, spec, last_tick_at) "
                "VALUES (:n, :n, :spec, :last)"
            ),
            {"n": name, "spec": spec, "last": last},
        )


def db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        now: datetime = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    return now


def test_four_racing_schedulers_enqueue_each_tick_exactly_once(
    fresh: Engine, migrated_url: str
) -> None:
    """Four schedulers on one 1-second schedule for three seconds: the ticks are consecutive
    seconds, each enqueued once, each job's run_at its tick, and the row records the last."""
    jobs = beat_jobs(every=timedelta(seconds=1))
    with running([scheduler(jobs, migrated_url, f"s{i}") for i in range(4)]) as schedulers:
        wait_until(lambda: len(ticks(fresh)) >= 5, "five ticks enqueued")
    seen = ticks(fresh)
    assert len(seen) == len(set(seen))
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(seen))
    assert sum(s.enqueued for s in schedulers) == len(seen)
    row = schedule_row(fresh)
    assert row["last_tick_at"] == seen[-1]
    assert row["next_tick_at"] == seen[-1] + timedelta(seconds=1)
    with fresh.connect() as conn:
        run_at = conn.execute(
            text("SELECT run_at FROM sqla_jobs_job WHERE id = :i"), {"i": row["last_job_id"]}
        ).scalar_one()
    assert run_at == seen[-1]


def test_a_tick_is_enqueued_ahead_of_its_time_and_never_runs_early(
    fresh: Engine, migrated_url: str
) -> None:
    """The jobs wait in pending with run_at at their tick, enqueued before it comes."""
    jobs = beat_jobs(every=timedelta(seconds=1))
    with running([scheduler(jobs, migrated_url)]):
        wait_until(lambda: len(ticks(fresh)) >= 2, "two ticks enqueued")
        with fresh.connect() as conn:
            ahead = conn.execute(
                text("SELECT count(*) FROM sqla_jobs_job WHERE run_at > clock_timestamp()")
            ).scalar_one()
    assert ahead >= 1


def test_a_scheduler_steps_over_a_schedule_locked_by_a_frozen_one(
    fresh: Engine, migrated_url: str
) -> None:
    """While another transaction holds one schedule's row (a scheduler frozen mid-tick), a
    scheduler enqueues nothing for it without waiting, keeps the other schedules ticking, and
    enqueues it once the lock is gone."""
    jobs = beat_jobs(every=timedelta(seconds=1))
    jobs.register("sweep", Sweep)
    jobs.add_periodic("sweep", every=timedelta(seconds=1))
    first = scheduler(jobs, migrated_url, "first")
    first.step()  # registers both rows (and enqueues their first ticks)
    before = ticks(fresh, "beat")
    with fresh.connect() as holder:
        holder.execute(text("SELECT 1 FROM sqla_jobs_schedule WHERE name = 'beat' FOR UPDATE"))
        with running([scheduler(jobs, migrated_url, "second")]):
            swept = len(ticks(fresh, "sweep"))
            wait_until(lambda: len(ticks(fresh, "sweep")) >= swept + 3, "sweep ticking")
            assert ticks(fresh, "beat") == before
            holder.rollback()
            wait_until(lambda: len(ticks(fresh, "beat")) > len(before), "beat enqueued again")
    first.engine.dispose()


@pytest.mark.parametrize(("missed", "kept"), [("skip", 0), ("once", 1), (3, 3)])
def test_ticks_missed_while_no_scheduler_ran_follow_the_policy(
    fresh: Engine, migrated_url: str, missed: object, kept: int
) -> None:
    """After an hour without a scheduler, a minutely schedule enqueues its latest tick (within
    its grace), plus none, the latest, or the N latest of the ticks it missed before that."""
    jobs = beat_jobs(every=timedelta(minutes=1), missed=missed)
    now = db_now(fresh)
    set_last_tick(fresh, "beat", now - timedelta(hours=1), "every 60s")
    s = scheduler(jobs, migrated_url)
    s.step()
    s.engine.dispose()
    latest = now.replace(second=0, microsecond=0)
    past = [t for t in ticks(fresh) if t < latest]
    assert past == [latest - timedelta(minutes=n) for n in range(kept, 0, -1)]
    assert latest in ticks(fresh)
    assert s.skipped == 59 - kept


def test_a_changed_definition_starts_over_without_backfilling(
    fresh: Engine, migrated_url: str
) -> None:
    """A schedule whose stored spec differs from the code's skips the old one's missed ticks
    even with missed=N, and records the new spec."""
    jobs = beat_jobs(every=timedelta(minutes=1), missed=5)
    now = db_now(fresh)
    set_last_tick(fresh, "beat", now - timedelta(hours=1), "every 30s")
    s = scheduler(jobs, migrated_url)
    s.step()
    s.engine.dispose()
    latest = now.replace(second=0, microsecond=0)
    assert [t for t in ticks(fresh) if t < latest] == []
    assert schedule_row(fresh)["spec"] == "every 60s"


def test_pause_holds_the_schedule_and_resume_skips_what_passed(
    fresh: Engine, migrated_url: str
) -> None:
    """A paused schedule enqueues nothing; resumed, it ticks from now on, none of the ticks of
    the pause caught up."""
    jobs = beat_jobs(every=timedelta(seconds=1), missed=100)
    with Session(fresh) as session, session.begin():
        jobs.pause_schedule(session, "beat")
    s = scheduler(jobs, migrated_url)
    s.step()
    assert ticks(fresh) == []
    with fresh.begin() as conn:  # as if it had been paused for an hour
        conn.execute(text("UPDATE sqla_jobs_schedule SET last_tick_at = now() - interval '1h'"))
    with Session(fresh) as session, session.begin():
        jobs.resume_schedule(session, "beat")
    resumed = db_now(fresh)
    s.step()
    s.engine.dispose()
    assert ticks(fresh)
    assert min(ticks(fresh)) > resumed - timedelta(seconds=1)


def test_run_schedule_enqueues_now_and_leaves_the_ticks_alone(
    fresh: Engine, migrated_url: str
) -> None:
    """``run_schedule`` enqueues one job to run now, tagged manual, and does not move the last
    tick; an unknown name raises before anything is written."""
    jobs = beat_jobs(every=timedelta(hours=1))
    s = scheduler(jobs, migrated_url)
    s.step()
    before = schedule_row(fresh)
    with Session(fresh) as session, session.begin():
        job = jobs.run_schedule(session, "beat")
        meta = job.meta
        with pytest.raises(ScheduleNotFoundError, match="declared: beat"):
            jobs.run_schedule(session, "nope")
    s.engine.dispose()
    assert meta["manual"] is True
    assert schedule_row(fresh)["last_tick_at"] == before["last_tick_at"]


def test_the_payload_function_gets_the_tick_and_a_failing_one_loses_nothing(
    fresh: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A payload built per tick sees the tick; one that raises writes nothing, is logged, and
    the tick is enqueued once the function works."""
    broken = threading.Event()
    broken.set()

    def build(tick: datetime) -> Digest:
        if broken.is_set():
            raise RuntimeError("report service down")
        return Digest(day=tick.isoformat())

    jobs = Jobs()
    jobs.register("digest", Digest)
    jobs.add_periodic("digest", every=timedelta(seconds=1), payload=build)
    s = scheduler(jobs, migrated_url)
    with caplog.at_level(logging.ERROR, "sqla_jobs.scheduler"):
        s.step()
    assert ticks(fresh, "digest") == []
    assert schedule_row(fresh, "digest")["last_tick_at"] is None
    assert "report service down" in caplog.text
    broken.clear()
    s.step()
    s.engine.dispose()
    with fresh.connect() as conn:
        payloads = conn.execute(
            text("SELECT payload->>'day', meta->>'tick' FROM sqla_jobs_job")
        ).all()
    assert payloads
    assert all(day == tick for day, tick in payloads)


def test_a_unique_kind_on_a_schedule_skips_a_tick_while_the_last_one_is_pending(
    fresh: Engine, migrated_url: str
) -> None:
    """A tick of a kind unique by kind alone finds the previous tick's job still pending: no
    second job, and the schedule still advances."""
    jobs = Jobs()
    jobs.register("sweep", Sweep, unique=Unique(by=()))
    jobs.add_periodic("sweep", every=timedelta(seconds=1))
    with running([scheduler(jobs, migrated_url)]):
        wait_until(lambda: last_tick(fresh, "sweep") is not None, "a tick")
        first = last_tick(fresh, "sweep")
        wait_until(lambda: last_tick(fresh, "sweep") != first, "advanced")
    with fresh.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar_one() == 1


def test_a_schedule_removed_from_the_code_stops_and_is_listed_as_such(
    fresh: Engine, migrated_url: str
) -> None:
    """Once the code no longer declares a schedule, no scheduler enqueues it (its row is left as
    it was) and the listing shows it as gone from the code, with no next tick."""
    both = beat_jobs(every=timedelta(seconds=1))
    both.register("sweep", Sweep)
    both.add_periodic("sweep", every=timedelta(seconds=1))
    first = scheduler(both, migrated_url)
    first.step()
    first.engine.dispose()
    before = schedule_row(fresh, "sweep")
    s = scheduler(beat_jobs(every=timedelta(seconds=1)), migrated_url)
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        time.sleep(min(s.step(), 0.5))
    s.engine.dispose()
    assert schedule_row(fresh, "sweep") == before
    assert len(ticks(fresh, "beat")) > len(ticks(fresh, "sweep"))
    with Session(fresh) as session:
        infos = {i.name: i for i in beat_jobs(every=timedelta(seconds=1)).list_schedules(session)}
    assert (infos["sweep"].in_code, infos["sweep"].next_tick_at) == (False, None)
    assert (infos["beat"].in_code, infos["beat"].next_tick_at is not None) == (True, True)


def test_a_schedule_row_deleted_by_hand_is_added_back(fresh: Engine, migrated_url: str) -> None:
    """Deleting a schedule's row does not stop it: the next round registers it again."""
    jobs = beat_jobs(every=timedelta(seconds=1))
    with running([scheduler(jobs, migrated_url)]):
        wait_until(lambda: ticks(fresh), "a tick")
        with fresh.begin() as conn:
            conn.execute(text("DELETE FROM sqla_jobs_schedule"))
        wait_until(lambda: last_tick(fresh) is not None, "registered again")


#: The period of the long-poll test's schedule: the NOTIFY of each enqueue (``LOOKAHEAD`` ahead of
#: its tick) falls this long minus ``LOOKAHEAD`` after the previous tick.
STAMP_EVERY = 5.0
#: Under the next enqueue's NOTIFY by a margin: a start this soon after its tick was woken by the
#: tick's own NOTIFY. A deadline for a loaded machine, not a latency benchmark.
STAMP_LATE = STAMP_EVERY - LOOKAHEAD.total_seconds() - 0.5


def test_a_worker_idle_on_a_long_poll_starts_the_tick_at_its_time(
    fresh: Engine, migrated_url: str
) -> None:
    """With a 60-second poll, only the scheduler's NOTIFY at the tick can start the job within
    STAMP_LATE of it (the NOTIFY of an enqueue, LOOKAHEAD ahead, falls later, never at a tick);
    schedules=False runs no scheduler."""
    started: list[tuple[datetime, float]] = []
    jobs = Jobs()

    @jobs.periodic(every=timedelta(seconds=STAMP_EVERY), payload=lambda tick: Stamp(tick=tick))
    @jobs.kind("stamp", Stamp)
    def stamp(payload: Stamp, ctx: object) -> None:
        started.append((payload.tick, time.time()))

    with running_workers(jobs, migrated_url, poll_interval=60.0):
        wait_until(lambda: len(started) >= 3, "three ticks run")
    lateness = [at - tick.timestamp() for tick, at in started[1:]]
    assert all(0 <= late < STAMP_LATE for late in lateness), lateness
    before = last_tick(fresh, "stamp")
    assert isinstance(before, datetime)
    # A window for what must not happen: until the next tick's time has passed on the database's
    # clock, later than any scheduler would have enqueued it (LOOKAHEAD ahead).
    after_next = before + timedelta(seconds=STAMP_EVERY + 1)
    with running_workers(jobs, migrated_url, schedules=False) as workers:
        assert workers[0].scheduler is None
        wait_until(lambda: db_now(fresh) > after_next, "past the next tick", interval=0.2)
    assert last_tick(fresh, "stamp") == before, "a tick advanced with schedules=False"


class FastClock(Scheduler):
    """A scheduler whose estimate of the database clock runs ``AHEAD`` seconds fast, as a loaded
    process's estimate can (a thread that waits for the GIL between its clock read and the query
    puts the midpoint late)."""

    AHEAD = 0.4

    def _db_time(self) -> float:
        return super()._db_time() + self.AHEAD


def test_the_notify_at_a_tick_waits_for_the_tick_on_the_database_clock(
    fresh: Engine, migrated_url: str
) -> None:
    """A scheduler whose clock estimate runs fast still sends a tick's NOTIFY only once the job is
    due by the database's clock: a claim woken by it finds the job (else the tick waits for the
    next NOTIFY or poll)."""
    jobs = beat_jobs(every=timedelta(seconds=1))
    due_at_notify: list[int] = []
    with psycopg.connect(libpq_conninfo(migrated_url), autocommit=True) as listen:
        listen.execute(f'LISTEN "{jobs.channel}"')
        with running([FastClock(jobs, Connector(libpq_conninfo(migrated_url), "fast"))]):
            for note in listen.notifies(timeout=DEADLINE, stop_after=3):
                assert note.payload == "default"
                with fresh.connect() as conn:
                    due_at_notify.append(
                        conn.execute(
                            text("SELECT count(*) FROM sqla_jobs_job WHERE run_at <= now()")
                        ).scalar_one()
                    )
    assert len(due_at_notify) == 3, "three NOTIFYs at ticks"
    # Each NOTIFY comes once its tick's job is due, and every job was announced to this listener
    # (it listened before the scheduler started): at the k-th, at least k jobs are due. Read as
    # the NOTIFY arrives; a read a loaded machine delays can only find more due, never fewer.
    assert all(due >= k for k, due in enumerate(due_at_notify, 1)), due_at_notify


def as_role(url: str, name: str) -> str:
    """``url`` logging in as the role ``name``: a TCP server's or a socket directory's alike."""
    login = make_url(url).set(username=name, password=None)
    assert login.username == name
    return login.render_as_string(hide_password=False)


def test_a_worker_refuses_to_start_without_the_right_to_write_schedules(
    fresh: Engine, migrated_url: str
) -> None:
    """A role that may not write sqla_jobs_schedule stops the worker before it claims, naming
    the grants and --no-schedules."""
    jobs = beat_jobs(every=timedelta(seconds=1))
    # A name of its own: roles are cluster-wide, and other runs share the server.
    reader = f"sched_reader_{secrets.token_hex(4)}"
    with fresh.begin() as conn:
        conn.execute(text(f"CREATE ROLE {reader} LOGIN"))
        conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}"))
    url = as_role(migrated_url, reader)
    try:
        from sqla_jobs import ConfigurationError

        worker = Worker(jobs, url, queues=["default"])
        with pytest.raises(ConfigurationError, match="--no-schedules"):
            worker.run_sync(install_signal_handlers=False)
        # The scheduler's connection went with the refusal, not left for the garbage collector.
        assert worker.scheduler is not None
        assert worker.scheduler.engine.pool.checkedin() == 0
        with fresh.connect() as conn:
            sessions = "SELECT count(*) FROM pg_stat_activity WHERE usename = :reader"
            assert conn.execute(text(sessions), {"reader": reader}).scalar_one() == 0
    finally:
        with fresh.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {reader}"))
            conn.execute(text(f"DROP ROLE {reader}"))


def test_a_grant_revoked_under_a_running_scheduler_is_reported_not_reconnected(
    fresh: Engine, migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal by the server (UPDATE on sqla_jobs_schedule revoked) is logged as an error and
    tried again after RETRY_AFTER, on the same connection; once granted back the tick comes."""
    jobs = beat_jobs(every=timedelta(seconds=1))
    role = f"sched_worker_{secrets.token_hex(4)}"
    with fresh.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}"))
        conn.execute(text(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"))
    s = scheduler(jobs, as_role(migrated_url, role))
    try:
        s.check()
        with fresh.begin() as conn:
            conn.execute(text(f"REVOKE SELECT ON sqla_jobs_schedule FROM {role}"))
        with caplog.at_level(logging.ERROR, "sqla_jobs.scheduler"):
            assert s._guarded_step() == RETRY_AFTER
        assert "permission denied" in caplog.text
        assert s._reconnects.failures == 0
        with fresh.begin() as conn:
            conn.execute(text(f"GRANT SELECT ON sqla_jobs_schedule TO {role}"))
        s._guarded_step()
        assert ticks(fresh)
    finally:
        s.engine.dispose()
        with fresh.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
