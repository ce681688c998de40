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
