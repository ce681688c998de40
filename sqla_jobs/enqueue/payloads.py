"""What a wakeup ``NOTIFY`` on the queue channel carries, written by enqueue and read by workers.

Two payloads: a queue's name (a job is due now in that queue: claim) and ``due QUEUE SECONDS`` (a
job of that queue becomes due in SECONDS, counted from the send: wake then). A queue name never
contains a space (:func:`~sqla_jobs.kinds.check_name`), so a worker that knows only the first
payload, an older release in a rolling deploy, finds no queue of its own in the second and
ignores it; a worker ignores any payload it cannot parse the same way, so a later form can be
added without breaking this one.
"""

from __future__ import annotations

import math

#: How far ahead an enqueue announces a delayed job; a worker re-reads the next due time at least
#: this often (its poll probe), so a job due later than this is found without a notice.
HORIZON = 60.0
_DUE = "due "


def format_due(queue: str, seconds: float) -> str:
    """The payload that says a job of ``queue`` becomes due in ``seconds``."""
    return f"{_DUE}{queue} {seconds:.6f}"


def parse_due(payload: str) -> tuple[str, float] | None:
    """(queue, seconds) of a ``due`` payload; None for any other payload, or a negative or
    non-finite time."""
    if not payload.startswith(_DUE):
        return None
    queue, _, seconds = payload[len(_DUE) :].rpartition(" ")
    try:
        wait = float(seconds)
    except ValueError:
        return None
    if not queue or not math.isfinite(wait) or wait < 0.0:
        return None
    return queue, wait
