"""What runs beside the story: workers in threads of their own, and a sampler of the database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine, Executable
from sqlalchemy.exc import DBAPIError

from sqla_jobs.worker.facade import Worker

from .invoices import DEADLINE


class DemoFailed(Exception):
    """Something the demo waits for did not happen in time."""


def wait_for(what: str, check: Callable[[], bool], timeout: float = DEADLINE) -> None:
    """Return once ``check()`` is true; raise :class:`DemoFailed` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


class RunningWorker:
    """A :class:`Worker` running in a thread of its own, as it would in a process of its own."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        # Named after the worker: its log records carry the name the story shows.
        self.thread = threading.Thread(target=self._run, name=worker.name, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run_sync(install_signal_handlers=False)
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        """Start the worker; return once it runs (:class:`DemoFailed` if it does not)."""
        self.thread.start()
        deadline = time.monotonic() + DEADLINE
        while not self.worker.started.wait(0.05):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise DemoFailed(f"{self.worker.name} did not start: {self.error!r}")

    def stop(self) -> None:
        """Stop the worker gracefully and wait for its thread; re-raise what it failed with."""
        self.worker.stop()
        self.thread.join(DEADLINE)
        if self.error is not None:
            raise DemoFailed(f"{self.worker.name} failed: {self.error!r}") from self.error


class Sampler(threading.Thread):
    """Runs one statement every ``interval`` seconds on a connection of its own; keeps its rows.

    The connection is in autocommit, so each reading sees what is committed at that moment.
    """

    def __init__(
        self,
        engine: Engine,
        statement: Executable,
        interval: float,
        on_row: Callable[[Sequence[Any]], None] | None = None,
    ) -> None:
        super().__init__(name="sqla-jobs-demo-sampler", daemon=True)
        self.engine = engine
        self.statement = statement
        self.interval = interval
        self.on_row = on_row
        self.rows: list[Sequence[Any]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with self.engine.connect() as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                while not self._stop_event.is_set():
                    row = conn.execute(self.statement).first()
                    if row is not None:
                        self.rows.append(tuple(row))
                        if self.on_row is not None:
                            self.on_row(tuple(row))
                    self._stop_event.wait(self.interval)
        except DBAPIError:
            pass  # the database went away (Ctrl-C cleanup): nothing left to sample

    def stop(self) -> None:
        """Stop sampling and wait for the thread (safe to call twice, or before it started)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(DEADLINE)
