"""The application the edge-case reliability scenarios run in real worker processes, and the
harness that starts them: ``python -m sqla_jobs.cli worker tests.reliability.edge_app:jobs``.

Handlers record what they do in ``reliability_edge_effects``, each row committed before the handler
goes on, so a test sees from outside the process which run did what, when by the database's clock
(``db_at``) and when by the worker process's own clock (``py_at``, which libfaketime may skew), even
if the process is SIGKILLed right after.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import psycopg
from pydantic import BaseModel

from sqla_jobs import JobContext, Jobs, Worker
from sqla_jobs.db.urls import libpq_conninfo
from tests._waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
#: Where handlers record their effects (default: ``DATABASE_URL``, the worker's own database). A
#: worker that reaches its database through PgBouncer still records directly in PostgreSQL.
EFFECTS_URL_ENV = "EDGE_EFFECTS_URL"
EFFECTS_TABLE = "reliability_edge_effects"
EFFECTS_DDL = f"""
CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    tag text NOT NULL,
    event text NOT NULL,
    attempt int NOT NULL,
    crashes int NOT NULL,
    pid int NOT NULL,
    db_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    py_at timestamptz NOT NULL
)
"""
#: How long any single condition of a subprocess scenario may take before the test fails.
DEADLINE = 20.0

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout: float = DEADLINE) -> T:
    """:func:`tests._waiting.wait_until` with this suite's longer default deadline."""
    return wait_until(check, what, timeout, interval=0.05)


jobs = Jobs()


class Hold(BaseModel):
    """Record ``started``, work for ``seconds``, record ``finished``."""

    tag: str
    seconds: float = 0.0


def effect(ctx: JobContext, tag: str, event: str) -> None:
    """Record ``event`` for the job, committed before this returns."""
    url = os.environ.get(EFFECTS_URL_ENV) or os.environ["DATABASE_URL"]
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {EFFECTS_TABLE} (job_id, tag, event, attempt, crashes, pid, py_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                ctx.job_id,
                tag,
                event,
                ctx.attempt,
                ctx.crashes,
                os.getpid(),
                datetime.now(timezone.utc),
            ),
        )


@jobs.kind("edge_hold", Hold, queue="edge")
def hold(args: Hold, ctx: JobContext) -> None:
    effect(ctx, args.tag, "started")
    # Stands in for real work. Not time.sleep: under libfaketime with a real monotonic clock,
    # CPython's clock_nanosleep(TIMER_ABSTIME) fails with EINVAL.
    threading.Event().wait(args.seconds)
    effect(ctx, args.tag, "finished")


# -- the harness ------------------------------------------------------------------------------------


@dataclass
class EdgeWorker:
    """A ``sqla-jobs worker tests.reliability.edge_app:jobs`` process and its log file."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_logged(self, event: str, timeout: float = DEADLINE) -> None:
        """Wait until the worker logs ``event=<event>`` (or fail, showing the log)."""

        def logged() -> bool:
            if f"event={event}" in self.log:
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited with {self.proc.returncode}")
            return False

        try:
            wait_for(logged, f"worker logs event={event}", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; exit code {self.proc.poll()}; log:\n{self.log}") from None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no lease given back, as the OOM killer would."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(DEADLINE)

    def stop(self) -> int:
        """SIGTERM, and the exit code once the worker has stopped gracefully."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(DEADLINE)


def worker_env(
    database_url: str, effects_url: str | None, extra: Mapping[str, str] | None
) -> dict[str, str]:
    """Our environment without any SQLA_JOBS_* setting, with the worker's database and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQLA_JOBS_")}
    env["DATABASE_URL"] = database_url
    if effects_url is not None:
        env[EFFECTS_URL_ENV] = effects_url
    env.update(extra or {})
    return env


@contextlib.contextmanager
def edge_workers(log_dir: Path) -> Iterator[Callable[..., EdgeWorker]]:
    """``spawn(database_url, *options, effects_url=None, env=None)`` starts a worker process;
    any still running when the block exits are killed."""
    started: list[EdgeWorker] = []

    def spawn(
        database_url: str,
        *options: str,
        effects_url: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> EdgeWorker:
        log_path = log_dir / f"edge-worker-{len(started)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sqla_jobs.cli", "worker", f"{__name__}:jobs", *options],
                cwd=REPO,
                env=worker_env(database_url, effects_url, env),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        worker = EdgeWorker(proc, log_path)
        started.append(worker)
        return worker

    try:
        yield spawn
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.kill()
        for w in started:
            w.proc.wait(DEADLINE)


@contextlib.contextmanager
def running(*workers: Worker) -> Iterator[list[BaseException]]:
    """Run in-process workers on threads; stop and join them on exit. A worker that crashed fails
    the test with its own error, rather than dying quietly on its thread. Yields the list the
    crashes are collected in, for :func:`wait_running`."""
    errors: list[BaseException] = []

    def main(worker: Worker) -> None:
        try:
            worker.run_sync(install_signal_handlers=False)
        except BaseException as exc:
            errors.append(exc)

    def started() -> bool:
        return bool(errors) or all(w.started.is_set() for w in workers)

    threads = [threading.Thread(target=main, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        wait_for(started, "the workers start")
        if errors:
            raise AssertionError(f"a worker crashed while starting: {errors[0]!r}") from errors[0]
        yield errors
    except BaseException as exc:
        if errors and errors[0] is not exc and exc.__cause__ is not errors[0]:
            raise AssertionError(f"{exc}; a worker had crashed: {errors[0]!r}") from errors[0]
        raise
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(DEADLINE + 30)
    assert not any(t.is_alive() for t in threads), "a worker did not stop"
    if errors:
        raise AssertionError(f"a worker crashed: {errors[0]!r}") from errors[0]


def wait_running(
    crashes: list[BaseException], check: Callable[[], T], what: str, timeout: float = DEADLINE
) -> T:
    """:func:`wait_for`, failing at once if one of the :func:`running` workers has crashed."""

    def guarded() -> T:
        if crashes:
            raise AssertionError(f"a worker crashed: {crashes[0]!r}") from crashes[0]
        return check()

    return wait_for(guarded, what, timeout)
