"""The demo prints the worker's log records from their message and structured fields alone."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from demo.console import Console
from demo.events import WorkerEvents


def _record(msg: str, args: tuple[object, ...], thread: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("sqla_jobs.worker", logging.WARNING, __file__, 1, msg, args, None)
    record.threadName = thread
    record.__dict__.update(extra)
    return record


def test_a_failure_is_shown_with_its_message_and_the_delay_until_its_run_at() -> None:
    failed_at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    record = _record(
        # The arguments in an order of the worker's choosing: the demo must not depend on it.
        "job %s failed attempt %s: %s (retry at %s)",
        (7, 2, "RuntimeError: boom (at /srv/app/tasks.py:12)", "later"),
        "worker-A",
        event="failed",
        run_at=failed_at + timedelta(seconds=1.5),
    )
    record.created = failed_at.timestamp()

    text = WorkerEvents(Console(), clock_offset=0.0).describe(record)

    assert text is not None
    first, arrow = text.splitlines()
    assert first == "worker-A: job 7 failed attempt 2: RuntimeError: boom (retry at later)"
    assert arrow.strip() == "-> back to pending, due again in 1.50s (run_at set by the database)"


def test_a_record_from_a_workers_service_thread_names_the_worker_and_the_service() -> None:
    record = _record("reaped job %s", (3,), "sqla-jobs-reaper-worker-C", event="reaped")

    assert WorkerEvents(Console(), 0.0).describe(record) == "worker-C (reaper): reaped job 3"


def test_the_workers_start_and_completions_are_left_to_the_story() -> None:
    record = _record("job %s completed", (1,), "worker-A", event="completed")

    assert WorkerEvents(Console(), 0.0).describe(record) is None
