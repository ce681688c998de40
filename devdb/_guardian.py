"""The embedded server's guardian: stops it and removes its data once the process that started it
is gone, however it went (SIGKILL, a SIGTERM with no handler, an xdist worker killed with its
controller), none of which runs a finalizer.

``python devdb/_guardian.py ROOT`` runs beside the owner, in a session of its own (a Ctrl-C or a
signal to the owner's process group does not reach it), with the read end of a pipe as its stdin.
The owner holds the write end and never writes to it: when the owner exits the kernel closes it,
the guardian reads EOF, stops any process still running on ``ROOT/data`` and deletes ``ROOT``. On a
clean exit the owner has already stopped the server itself, and the guardian finds nothing to stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import psutil

#: The postmaster's fast shutdown (SIGINT) first; immediate (SIGQUIT), then SIGKILL, if it lingers.
ESCALATION = ((0.0, signal.SIGINT), (5.0, signal.SIGQUIT), (10.0, signal.SIGKILL))
#: Give up on a process that survives SIGKILL (it cannot, short of a hung kernel) after this long.
GIVE_UP = 20.0


def on_pgdata(pgdata: Path) -> list[psutil.Process]:
    """The processes whose command line names ``pgdata``: the postmaster (``postgres -D``), and
    ``pg_ctl``, ``initdb`` or pg_ctl's shell if the owner died while they were starting it."""
    needle = str(pgdata)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.pid != os.getpid() and any(needle in arg for arg in cmdline):
            found.append(proc)
    return found


def stop_all(pgdata: Path) -> None:
    """Stop every process on ``pgdata``, the postmaster politely first, and wait until none is left."""
    started = time.monotonic()
    sent: dict[int, signal.Signals] = {}
    while (procs := on_pgdata(pgdata)) and time.monotonic() - started < GIVE_UP:
        elapsed = time.monotonic() - started
        for proc in procs:
            if proc.info["cmdline"][0].endswith("postgres"):
                # The strongest step of the escalation that is due; each is sent once.
                due = [sig for after, sig in ESCALATION if elapsed >= after][-1]
            else:
                # pg_ctl, initdb or a shell: nothing of theirs is worth a clean shutdown.
                due = signal.SIGKILL
            if sent.get(proc.pid) != due:
                sent[proc.pid] = due
                try:
                    proc.send_signal(due)
                except psutil.Error:
                    pass
        psutil.wait_procs(procs, timeout=0.2)


def main(argv: list[str]) -> int:
    root = Path(argv[1])
    # The owner's terminal and process group are not ours; only EOF on stdin ends the watch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    stop_all(root / "data")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
