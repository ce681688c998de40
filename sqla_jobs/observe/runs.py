"""What a worker tells an observer of its runs (the metrics, when they are on): a narrow,
synchronous interface, called on the worker's event loop (``started``, ``ended``) and on its reaper
thread (``reaped``). Without an observer each call site costs one ``is None`` test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sqla_jobs._outcome import Outcome
    from sqla_jobs.context import ClaimedJob


class Observer(Protocol):
    """Hears each run of a job: when its handler starts, how it ended, and each job the reaper
    rescued from a worker that stopped heartbeating. Each call must be quick and must not raise."""

    def started(self, job: ClaimedJob, now: float) -> None:
        """``job``'s handler starts now (``now``: ``time.monotonic()``)."""

    def ended(self, outcome: Outcome, ran: bool) -> None:
        """A run ended with ``outcome`` (before it is written); ``ran`` is False for a job
        cancelled before it started."""

    def reaped(self, kind: str, queue: str) -> None:
        """This worker's reaper put back (or made dead) a job of ``kind`` in ``queue`` whose lease
        expired: a crash of the worker that held it."""


class Observers:
    """Several observers heard as one, in order (the metrics and the throughput tally)."""

    def __init__(self, *observers: Observer) -> None:
        self._observers = observers

    def started(self, job: ClaimedJob, now: float) -> None:
        for observer in self._observers:
            observer.started(job, now)

    def ended(self, outcome: Outcome, ran: bool) -> None:
        for observer in self._observers:
            observer.ended(outcome, ran)

    def reaped(self, kind: str, queue: str) -> None:
        for observer in self._observers:
            observer.reaped(kind, queue)
