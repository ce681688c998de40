"""Printing the story: step titles, wrapped explanations, and timestamped events from any thread."""

from __future__ import annotations

import re
import textwrap
import threading
import time

#: The number of steps the story has (shown as ``[n/8]``).
STEPS = 8

_AT_PATH = re.compile(r" \(at [^()]*?([^/\\()]+:\d+)\)")


class Console:
    """Writes the story to stdout; ``event`` lines carry the time since :meth:`restart_clock`."""

    def __init__(self) -> None:
        self.started = time.time()
        self.t0 = self.started
        # Worker threads, the sampler and the handlers print too: one line at a time.
        self._lock = threading.Lock()

    def say(self, text: str = "", indent: int = 3) -> None:
        """Print ``text`` indented (an empty line for no text)."""
        with self._lock:
            print(textwrap.indent(text, " " * indent) if text else "", flush=True)

    def explain(self, text: str) -> None:
        """Print a paragraph, its whitespace collapsed and wrapped at 96 columns."""
        self.say(textwrap.fill(" ".join(text.split()), width=96, break_on_hyphens=False))

    def step(self, number: int, title: str) -> None:
        """Print the heading of step ``number``."""
        self.say()
        self.say(f"[{number}/{STEPS}] {title}", indent=0)
        self.say("-" * (len(title) + 6), indent=0)

    def restart_clock(self) -> None:
        """Count the ``t+`` of the next events from now."""
        self.t0 = time.time()

    def event(self, text: str, at: float | None = None) -> None:
        """Print something that happened at ``at`` (a ``time.time()``; default now)."""
        moment = (time.time() if at is None else at) - self.t0
        self.say(f"[t+{moment:5.2f}s] {text}", indent=5)


def short_error(error: str) -> str:
    """A ``last_error`` with the handler's file shortened to its name (``(at invoices.py:123)``)."""
    return _AT_PATH.sub(r" (at \1)", error)


def no_location(error: str) -> str:
    """A ``last_error`` or log message without the handler's location."""
    return _AT_PATH.sub("", error)
