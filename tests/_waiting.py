"""Waiting on a condition with a deadline: tests never sleep for time to pass."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

#: How long any single condition may take before the test fails. A deadline, not a wait: a check
#: returns as soon as it holds. Generous, for a loaded machine: the suite runs in parallel processes,
#: and a worker process's start (its imports) alone can take seconds there.
DEADLINE = 60.0

T = TypeVar("T")


def wait_until(
    check: Callable[[], T], what: str, timeout: float = DEADLINE, interval: float = 0.02
) -> T:
    """Poll ``check`` until it returns something truthy and return that; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(interval)
