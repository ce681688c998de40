"""The tables beside the queue: queue pauses, periodic schedules, the registry of live workers,
and the per-minute throughput counts. No claim reads them but the queue pauses."""

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    Integer,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from sqla_jobs.model.names import (
    QUEUE_TABLE,
    SCHEDULE_TABLE,
    THROUGHPUT_TABLE,
    WORKER_TABLE,
    Base,
)


class QueueState(Base):
    """What an operator set on a queue: paused or not. A queue without a row is active; the
    claim reads this table, so a pause holds for every worker, including ones started later."""

    __tablename__ = QUEUE_TABLE

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    #: Set while the queue is paused: no worker claims from it (enqueue still works).
    paused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Schedule(Base):
    """One periodic schedule's state, shared by every process that runs the scheduler: the last
    tick enqueued, advanced by compare-and-set in the transaction that enqueues the tick's job,
    so that each tick is enqueued once however many schedulers run. Written by the schedulers;
    the definition itself (cron or interval, kind, payload) lives in the application's code."""

    __tablename__ = SCHEDULE_TABLE

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    #: The schedule as defined when its last tick was enqueued (``cron */5 * * * * UTC``,
    #: ``every 30s``): a changed definition starts over from the next tick, never backfills.
    spec: Mapped[str] = mapped_column(Text)
    #: The last tick enqueued (the compare-and-set column); NULL until the first.
    last_tick_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: The job enqueued for ``last_tick_at``.
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)
    #: The tick after ``last_tick_at``, as the scheduler that wrote it computed it (for listings).
    next_tick_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Set while an operator holds the schedule: no tick is enqueued, and the ticks passed meanwhile
    #: are skipped.
    paused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: When a scheduler last found this schedule in its code: a schedule removed from the code is
    #: seen no more, and enqueues nothing.
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RegisteredWorker(Base):
    """A live worker process, as it registered itself: written when it starts, its heartbeat moved
    forward by its reaper thread, deleted when it stops gracefully; a row whose ``expires_at`` has
    passed (its process was killed, or lost the database for that long) is deleted by any other
    worker's reaper. For listings only (``sqla-jobs workers``): no claim reads it."""

    __tablename__ = WORKER_TABLE

    #: The worker's name (``host:pid:random`` unless named): also in its connections'
    #: ``application_name`` and in ``locked_by`` of the jobs it holds.
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    concurrency: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    #: The last heartbeat plus three of the worker's own heartbeat intervals, by the database's
    #: clock: past it, the row is stale and pruned.
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ThroughputMinute(Base):
    """What the workers finished in one minute, per queue and kind: counts by outcome, and the sums
    of run times and pickup delays (start minus ``run_at``) to average them by. Written by each
    worker at its reaper's beat as one upsert adding its counts to the minute's row, by the
    database's clock; pruned after :attr:`~sqla_jobs.Retention.throughput`. Completed jobs are
    deleted, so this is where a dashboard's throughput and latency over time come from
    (:func:`sqla_jobs.throughput.recent`). No claim reads it."""

    __tablename__ = THROUGHPUT_TABLE

    #: The start of the minute, by the database's clock when the worker wrote its counts.
    minute: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text, primary_key=True)
    completed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    #: Failed runs that will be retried (a run that used its last attempt counts as ``dead``).
    failed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    dead: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cancelled: Mapped[int] = mapped_column(BigInteger, server_default="0")
    snoozed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    #: Jobs the workers' reapers rescued from a worker that stopped heartbeating.
    crashed: Mapped[int] = mapped_column(BigInteger, server_default="0")
    #: Handler runs timed, and their total duration in seconds.
    runs: Mapped[int] = mapped_column(BigInteger, server_default="0")
    run_seconds: Mapped[float] = mapped_column(Double, server_default="0")
    #: Jobs started, and their total wait from ``run_at`` to their start in seconds.
    pickups: Mapped[int] = mapped_column(BigInteger, server_default="0")
    pickup_seconds: Mapped[float] = mapped_column(Double, server_default="0")
