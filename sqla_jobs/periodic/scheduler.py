"""The scheduler thread: enqueues the ticks of the application's periodic schedules.

Every worker runs one (unless told not to) and no leader is elected: each tick is enqueued once
because the transaction that enqueues it also moves the schedule's last tick forward by
compare-and-set (:func:`~sqla_jobs.sql.schedules.advance_schedule`). Of two schedulers that plan the
same tick, one advances the row and the other finds it changed, enqueues nothing and reads it
again. A scheduler that dies mid-transaction rolls back both; the next one enqueues the tick.

Ticks are enqueued :data:`LOOKAHEAD` ahead, with ``run_at`` at their time, and the scheduler that
enqueued one sends its queue a NOTIFY at that time, so an idle worker starts it on time instead
of at its next poll (a scheduler that dies before sending it leaves the job to the poll). All
planning runs on the database clock, estimated in the process; the server holds each NOTIFY until
its own clock has passed the tick, so an estimate that errs never wakes a worker early.

The jobs are written by :meth:`Jobs.enqueue <sqla_jobs.Jobs.enqueue>` in a ``Session`` of the
scheduler's own (one connection, not autocommit), so enqueue hooks, unique kinds and validation
apply to scheduled jobs as to any other.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from sqla_jobs.db.connections import (
    CONNECTION_ERRORS,
    Connector,
    Reconnects,
    serve,
    should_reconnect,
)
from sqla_jobs.db.failover import failover_safe
from sqla_jobs.errors import ConfigurationError
from sqla_jobs.periodic.ops import Host
from sqla_jobs.periodic.schedule import Periodic, Plan
from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import schedules as schedules_sql
from sqla_jobs.sql import tables as tables_sql

log = logging.getLogger("sqla_jobs.scheduler")

#: How far ahead of its time a tick is enqueued.
LOOKAHEAD = timedelta(seconds=2)
#: The longest a scheduler sleeps: how soon it sees a schedule resumed or a lost race settled.
MAX_SLEEP = 5.0
#: The shortest wait before planning a schedule again.
MIN_SLEEP = timedelta(milliseconds=10)
#: After a failed tick (a payload function raising, say): the wait before trying it again.
RETRY_AFTER = 5.0
#: After losing a compare-and-set: the wait before reading the schedule again.
RACE_RECHECK = 0.2
#: A scheduler silent this long inside a tick's transaction is disconnected by the server.
IDLE_IN_TRANSACTION = "10s"

_ERRORS = (*CONNECTION_ERRORS, DBAPIError)
_Outcome = Literal["advanced", "lost", "failed", "waiting"]


class Scheduler(threading.Thread):
    """Enqueues the ticks of ``jobs.schedules`` until :meth:`stop`."""

    def __init__(self, jobs: Host, connector: Connector, *, lookahead: timedelta = LOOKAHEAD):
        super().__init__(name=f"sqla-jobs-scheduler-{connector.worker}", daemon=True)
        self._jobs = jobs
        self._schedules = jobs.schedules
        self._lookahead = lookahead
        self._options: dict[str, Any] = (
            {} if jobs.schema is None else {"schema_translate_map": {None: jobs.schema}}
        )
        self.engine: Engine = create_engine(
            "postgresql+psycopg://",
            creator=lambda: psycopg.connect(
                connector.conninfo, **connector._options("scheduler", {"autocommit": False})
            ),
            pool_size=1,
            max_overflow=0,
            pool_pre_ping=True,
        )
        failover_safe(self.engine)
        self._stop_event = threading.Event()
        self._reconnects = Reconnects("scheduler connection", "scheduler_conn_lost")
        self._registered = False
        #: Seconds to add to ``time.time()`` to read the database clock.
        self._offset = 0.0
        #: (database time, queue) of the NOTIFYs due at the ticks enqueued ahead.
        self._notifies: list[tuple[float, str]] = []
        #: Jobs enqueued and ticks skipped, for tests and the logs.
        self.enqueued = 0
        self.skipped = 0

    # -- lifecycle ---------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`ConfigurationError` unless the role may enqueue and write schedules."""
        with self.engine.connect() as conn:
            row = conn.execute(
                catalog_sql.scheduler_privileges(),
                {
                    "job_table": tables_sql.job_table_name(self._jobs.schema),
                    "schedule_table": tables_sql.schedule_table_name(self._jobs.schema),
                },
            ).one()
        if not (row.enqueue and row.schedules):
            raise ConfigurationError(
                f"this worker runs {len(self._schedules)} periodic schedule(s) but its database "
                "role may not enqueue them (INSERT on sqla_jobs_job; SELECT, INSERT, UPDATE on "
                "sqla_jobs_schedule): grant them as docs/roles.md says, or run the worker with "
                "--no-schedules (Worker(schedules=False))"
            )

    def stop(self) -> None:
        """Ask the thread to finish its current step and exit."""
        self._stop_event.set()

    def run(self) -> None:
        serve(
            self._stop_event,
            self._guarded_step,
            self._reconnects,
            close=self.engine.dispose,
            errors=_ERRORS,
        )

    def _guarded_step(self) -> float:
        # A bug or an unforeseen error must not end scheduling for the life of the worker, and
        # an error the server reports (a grant revoked, say) is no reason to reconnect.
        try:
            return self.step()
        except _ERRORS as exc:
            if _connection_lost(exc):
                raise
            log.error(
                "scheduler step failed, trying again in %gs: %s",
                RETRY_AFTER,
                exc,
                extra={"event": "scheduler_failed"},
            )
            return RETRY_AFTER
        except Exception:
            log.exception(
                "scheduler step failed, trying again in %gs",
                RETRY_AFTER,
                extra={"event": "scheduler_failed"},
            )
            return RETRY_AFTER

    # -- one round -----------------------------------------------------------------------------------

    def step(self) -> float:
        """Send the NOTIFYs due, enqueue every tick due, and return the seconds until the next
        thing to do."""
        self._send_notifies()
        rows, now = self._read()
        wake = now + timedelta(seconds=MAX_SLEEP)
        for schedule in self._schedules:
            row = rows.get(schedule.name)
            if row is None:
                self._registered = False  # deleted by hand: add it back next round
                continue
            if row.paused_at is not None:
                continue
            restart = row.last_tick_at is not None and row.spec != schedule.spec
            plan = schedule.plan(row.last_tick_at, now, horizon=self._lookahead, restart=restart)
            outcome = "waiting" if plan.advance_to is None else self._tick(schedule, row, plan, now)
            if outcome == "lost":
                wake = min(wake, now + timedelta(seconds=RACE_RECHECK))
            elif outcome == "failed":
                wake = min(wake, now + timedelta(seconds=RETRY_AFTER))
            else:
                # Never sooner than MIN_SLEEP: a tick arithmetic fault must not spin the thread.
                wake = min(wake, max(plan.next - self._lookahead, now + MIN_SLEEP))
        seconds = (wake - now).total_seconds()
        if self._notifies:
            seconds = min(seconds, self._notifies[0][0] - self._db_time())
        return max(0.0, seconds)

    def _read(self) -> tuple[dict[str, Any], datetime]:
        names = [s.name for s in self._schedules]
        with Session(self.engine) as session, session.begin():
            if not self._registered:
                session.execute(
                    schedules_sql.register_schedules(),
                    {
                        "names": names,
                        "kinds": [s.kind.name for s in self._schedules],
                        "specs": [s.spec for s in self._schedules],
                    },
                    execution_options=self._options,
                )
                self._registered = True
            before = time.time()
            result = session.execute(
                schedules_sql.read_schedules(), {"names": names}, execution_options=self._options
            ).all()
            after = time.time()
        if not result:  # every row deleted by hand: added back next round
            return {}, datetime.fromtimestamp(self._db_time(), timezone.utc)
        now: datetime = result[0].now
        self._offset = now.timestamp() - (before + after) / 2
        return {r.name: r for r in result}, now

    def _tick(self, schedule: Periodic, row: Any, plan: Plan, now: datetime) -> _Outcome:
        """Enqueue ``plan``'s ticks and advance the schedule, in one transaction: "lost" if
        another scheduler advanced it first (or it was paused meanwhile), "failed" if the jobs
        could not be built or enqueued (nothing written)."""
        assert plan.advance_to is not None
        queue = schedule.queue or schedule.kind.options.queue
        try:
            with Session(self.engine) as session, session.begin():
                session.execute(
                    schedules_sql.limit_idle_in_transaction(), {"timeout": IDLE_IN_TRANSACTION}
                )
                won = session.execute(
                    schedules_sql.advance_schedule(),
                    {
                        "schedule_name": schedule.name,
                        "prev": row.last_tick_at,
                        "tick": plan.advance_to,
                        "next_tick": plan.next,
                        "schedule_spec": schedule.spec,
                        "schedule_kind": schedule.kind.name,
                    },
                    execution_options=self._options,
                ).first()
                if won is None:
                    session.rollback()
                    return "lost"
                job_id = None
                for tick in plan.ticks:
                    job = self._jobs.enqueue(
                        session,
                        schedule.build_payload(tick),
                        run_at=tick,
                        queue=schedule.queue,
                        priority=schedule.priority,
                        meta={"schedule": schedule.name, "tick": tick.isoformat()},
                    )
                    job_id = job.id
                if job_id is not None:
                    session.execute(
                        schedules_sql.record_schedule_job(),
                        {"schedule_name": schedule.name, "last_job": job_id},
                        execution_options=self._options,
                    )
        except _ERRORS as exc:
            if _connection_lost(exc):
                raise
            return self._failed(schedule, exc)
        except Exception as exc:  # a payload function or a hook: logged, the tick tried again
            return self._failed(schedule, exc)
        self.enqueued += len(plan.ticks)
        self.skipped += plan.skipped
        for tick in plan.ticks:
            if tick > now:
                heapq.heappush(self._notifies, (tick.timestamp(), queue))
        if plan.skipped:
            log.warning(
                "schedule %s: skipped %d missed tick(s) up to %s (missed=%r)",
                schedule.name,
                plan.skipped,
                plan.advance_to.isoformat(),
                schedule.missed,
                extra={"event": "schedule_skipped", "schedule": schedule.name},
            )
        log.debug(
            "schedule %s: enqueued %d tick(s), next at %s",
            schedule.name,
            len(plan.ticks),
            plan.next.isoformat(),
            extra={"event": "schedule_enqueued", "schedule": schedule.name},
        )
        return "advanced"

    def _failed(self, schedule: Periodic, exc: BaseException) -> _Outcome:
        log.error(
            "schedule %s: could not enqueue its tick, trying again in %gs: %s",
            schedule.name,
            RETRY_AFTER,
            exc,
            exc_info=exc,
            extra={"event": "schedule_failed", "schedule": schedule.name},
        )
        return "failed"

    def _db_time(self) -> float:
        return time.time() + self._offset

    def _send_notifies(self) -> None:
        due = self._db_time()
        queues: set[str] = set()
        latest = 0.0
        while self._notifies and self._notifies[0][0] <= due:
            latest, queue = heapq.heappop(self._notifies)
            queues.add(queue)
        if not queues:
            return
        with self.engine.connect() as conn:
            # The clock estimate can run fast (a thread kept from the GIL between its clock read
            # and its query): the server waits out what is left before the NOTIFYs commit.
            conn.execute(
                enqueue_sql.sleep_until(),
                {
                    "until": datetime.fromtimestamp(latest, timezone.utc),
                    "cap": self._lookahead.total_seconds(),
                },
            )
            for queue in sorted(queues):
                conn.execute(enqueue_sql.notify(), {"channel": self._jobs.channel, "queue": queue})
            conn.commit()


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (or timed out) or its server is not the
    primary any more, not a refusal by the server."""
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or (exc.orig is not None and should_reconnect(exc.orig))
    return True
