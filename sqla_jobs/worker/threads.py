"""Threads for sync handlers: a fixed set of runners whose completions wake the event loop in
batches.

A thread pool executor costs a future, a condition variable and a self-pipe write per job; with
short handlers that overhead, not the handler, sets the worker's pace. Here each runner thread
appends its result to a deque and wakes the loop only if no wakeup is already pending, so a burst
of completions costs one wakeup. A handler past its timeout cannot be interrupted (Python threads
cannot be killed): its runner stays busy until it returns, and so does the slot that waits for it.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any

_Item = tuple["asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...], "int | None"]
_Done = tuple["asyncio.Future[Any]", Any, BaseException | None]


class SyncRunners:
    """``size`` daemon threads running sync callables for one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, name: str) -> None:
        self._loop = loop
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._done: collections.deque[_Done] = collections.deque()
        self._signaled = False
        self._count = 0
        #: The job id each runner is running (None: idle), by runner: what a shutdown left behind.
        self._current: list[int | None] = []
        for _ in range(size):
            self._spawn()

    def submit(
        self, fn: Callable[..., Any], *args: Any, job_id: int | None = None
    ) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` (for job ``job_id``) on a runner; the future resolves on the loop."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._queue.put((fut, fn, args, job_id))
        return fut

    def busy(self) -> list[tuple[str, int | None]]:
        """The runners still inside a call: each thread's name and the job it runs."""
        return [
            (f"{self._name}-{at + 1}", None if job_id == -1 else job_id)
            for at, job_id in enumerate(self._current)
            if job_id is not None
        ]

    def close(self) -> None:
        """Ask every runner to exit once its current call returns."""
        for _ in range(self._count):
            self._queue.put(None)

    def _spawn(self) -> None:
        at = self._count
        self._count += 1
        self._current.append(None)
        threading.Thread(
            target=self._run, args=(at,), name=f"{self._name}-{self._count}", daemon=True
        ).start()

    def _run(self, at: int) -> None:
        get = self._queue.get
        while (item := get()) is not None:
            ran = self._run_one(at, *item)
            del item  # its future holds the run's error until the next job comes
            if not ran:
                return  # the loop is closed: nobody is waiting any more

    def _run_one(
        self,
        at: int,
        fut: asyncio.Future[Any],
        fn: Callable[..., Any],
        args: Any,
        job_id: int | None,
    ) -> bool:
        # A call of its own: what the run held (its arguments, its error and the handler's frames
        # in the error's traceback) is freed when it returns, not kept until the next job.
        current = self._current
        current[at] = -1 if job_id is None else job_id
        try:
            done: _Done = (fut, fn(*args), None)
        except BaseException as exc:  # handed to the awaiting task, never lost
            done = (fut, None, exc)
        current[at] = None
        self._done.append(done)
        del done, fut  # an error's traceback holds this frame: no cycle through its future
        # Wake the loop only if it has no wakeup pending: it drains everything at once.
        if not self._signaled:
            self._signaled = True
            try:
                self._loop.call_soon_threadsafe(self._collect)
            except RuntimeError:
                return False
        return True

    def _collect(self) -> None:
        # Reset before draining: a result appended after this line signals again.
        self._signaled = False
        while self._done:
            fut, result, exc = self._done.popleft()
            if fut.cancelled():
                continue  # timed out or shut down: the task has moved on
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)
