"""Run in-process workers for a test and always stop them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from sqlalchemy import Engine, text

from sqla_jobs import Jobs, Worker
from tests._waiting import DEADLINE
from tests._waiting import wait_until as _wait


@contextlib.contextmanager
def running_workers(
    jobs: Jobs, url: str, count: int = 1, **options: object
) -> Iterator[list[Worker]]:
    """Start ``count`` workers in threads; stop and join them on exit."""
    workers = [Worker(jobs, url, **options) for _ in range(count)]  # type: ignore[arg-type]
    threads = [
        threading.Thread(target=w.run_sync, kwargs={"install_signal_handlers": False}, daemon=True)
        for w in workers
    ]
    for t in threads:
        t.start()
    try:
        for w in workers:
            assert w.started.wait(DEADLINE), "worker did not start"
        yield workers
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(DEADLINE)


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE, what: str = "") -> None:
    """Poll ``condition`` until it holds, or fail after ``timeout`` seconds."""
    _wait(condition, what or str(condition), timeout)


def queue_empty(engine: Engine) -> Callable[[], bool]:
    """A condition: the queue table holds no rows."""

    def check() -> bool:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 0

    return check


def parked(worker: Worker) -> Callable[[], bool]:
    """The fetch loop sleeps with nothing held, and the listener is connected: a NOTIFY now is
    claimed by the listener's thread.

    The park must come after the wakeup the listener sends once it listens: the loop may park
    before the listener connects (a NOTIFY then reaches nobody), and that wakeup then makes the
    loop claim on its own connection (failed in CI when the LISTEN came late)."""

    def ready() -> bool:
        listener, handoff, wakeups = worker.listener, worker.handoff, worker.wakeups
        parked = handoff.parked if handoff is not None else None
        return (
            listener is not None
            and wakeups is not None
            and listener.connected.is_set()
            and not wakeups.pending
            and parked is not None
            and parked[1] == wakeups.count
        )

    return ready
