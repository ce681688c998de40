"""Ports for the servers the reliability tests start (PostgreSQL, PgBouncer) on 127.0.0.1.

A port is chosen below the kernel's ephemeral range, so an outgoing connection of a parallel
test can never hold it as its local port; two test processes may still draw the same one, and a
server that cannot bind is started again on another (:func:`bind_failed` says so from its log).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Below Linux's default ephemeral range (32768-60999), above the registered services we know of.
LOW, HIGH = 20000, 32767
#: How many ports a server is tried on before its test fails.
ATTEMPTS = 8
_MESSAGES = ("Address already in use", "could not create any TCP/IP sockets")


def _ephemeral() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(low, high + 1)


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now, outside the ephemeral range when possible."""
    ephemeral = _ephemeral()
    for _ in range(200):
        port = random.randint(LOW, HIGH)
        if port in ephemeral:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_size(log: Path) -> int:
    """Where a server's log ends now: what a start writes after it is :func:`bind_failed`'s."""
    try:
        return log.stat().st_size
    except OSError:
        return 0


def bind_failed(log: Path, since: int = 0) -> bool:
    """Whether a server's log, from byte ``since``, says it could not listen on its port."""
    try:
        with log.open("rb") as fh:
            fh.seek(since)
            text = fh.read().decode(errors="replace")
    except OSError:
        return False
    return any(message in text for message in _MESSAGES)


def log_tail(log: Path, lines: int = 20) -> str:
    """The last lines of a server's log, for an error message."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"
