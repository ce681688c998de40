"""A primary and a streaming hot standby of its own, for the tests that need a real replica.

Built from the machine's PostgreSQL binaries (``SQLA_JOBS_PG_BIN``, else PostgreSQL 15's under
/usr/lib/postgresql): ``initdb``, then ``pg_basebackup -R`` for the standby, each server on a free
port of 127.0.0.1 and a socket directory of its own in a temporary directory, run as the
``postgres`` OS user when the tests run as root. Both are stopped, and their files removed, on exit.
The shared server of ``DATABASE_URL`` is never touched.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ._ports import ATTEMPTS, bind_failed, free_port, log_size, log_tail

BIN = Path(os.environ.get("SQLA_JOBS_PG_BIN", "/usr/lib/postgresql/15/bin"))
#: Seconds a server gets to start, or the standby to replay what the primary wrote.
TIMEOUT = 60.0


def _owner() -> pwd.struct_passwd | None:
    """The OS user the servers run as: ``postgres`` when the tests run as root (PostgreSQL
    refuses root), else the tests' own user (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root, and there is no postgres OS user to run a server as")


@dataclass
class Pair:
    """A running primary and its streaming standby (trust authentication, user ``postgres``)."""

    root: Path
    primary_port: int
    standby_port: int
    owner: pwd.struct_passwd | None

    def url(self, server: str, database: str = "postgres", **query: str) -> str:
        """A URL of ``server`` (``"primary"`` or ``"standby"``)."""
        port = self.primary_port if server == "primary" else self.standby_port
        extra = "".join(f"&{k}={v}" for k, v in query.items())
        return f"postgresql://postgres@127.0.0.1:{port}/{database}?connect_timeout=5{extra}"

    def connect(self, server: str, database: str = "postgres") -> psycopg.Connection[Any]:
        """An autocommit connection to ``server``."""
        port = self.primary_port if server == "primary" else self.standby_port
        return psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname=database, autocommit=True
        )

    def caught_up(self, timeout: float = TIMEOUT) -> None:
        """Wait until the standby has replayed everything the primary has written so far."""
        with self.connect("primary") as primary:
            target = primary.execute("SELECT CAST(pg_current_wal_insert_lsn() AS text)").fetchone()
        assert target is not None
        deadline = time.monotonic() + timeout
        with self.connect("standby") as standby:
            while True:
                row = standby.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target[0],)
                ).fetchone()
                if row is not None and row[0]:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the standby did not replay up to {target[0]}")
                time.sleep(0.05)

    def run(self, *argv: str) -> None:
        """Run one of PostgreSQL's programs as the servers' OS user."""
        user = {} if self.owner is None else {"user": self.owner.pw_uid, "group": self.owner.pw_gid}
        env = {**os.environ, "LC_ALL": "C", "PGUSER": "postgres"}
        done = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            **user,  # type: ignore[arg-type]
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {done.stdout}{done.stderr}")

    def start(self, server: str, settings: dict[str, str]) -> None:
        """Start ``server`` with ``settings`` on its port; on another port if that one is taken."""
        log = self.root / f"{server}.log"
        for _ in range(ATTEMPTS):
            port = self.primary_port if server == "primary" else self.standby_port
            with open(self.root / server / "postgresql.conf", "a") as conf:
                conf.write(_settings(port, self.root, settings))  # the last setting wins
            since = log_size(log)
            try:
                self.run("pg_ctl", "-D", server, "-l", log.name, "-w", "start")
                return
            except AssertionError as exc:
                if not bind_failed(log, since):
                    raise AssertionError(f"{exc}\n{server}.log ends:\n{log_tail(log)}") from None
            if server == "primary":
                self.primary_port = free_port()
            else:
                self.standby_port = free_port()
        raise AssertionError(f"the {server} found no free port in {ATTEMPTS} tries")


def _settings(port: int, sockets: Path, extra: dict[str, str]) -> str:
    settings = {
        "port": str(port),
        "listen_addresses": "'127.0.0.1'",
        "unix_socket_directories": f"'{sockets}'",
        "wal_level": "replica",
        "max_wal_senders": "4",
        "hot_standby": "on",
        "fsync": "off",
        "full_page_writes": "off",
        "shared_buffers": "16MB",
        "max_connections": "40",
        **extra,
    }
    return "".join(f"{k} = {v}\n" for k, v in settings.items())


@contextlib.contextmanager
def streaming_pair(standby_settings: dict[str, str] | None = None) -> Iterator[Pair]:
    """Start a primary and a hot standby streaming from it; stop both and remove them on exit."""
    if not (BIN / "pg_basebackup").exists():
        pytest.skip(f"no PostgreSQL binaries at {BIN} (set SQLA_JOBS_PG_BIN)")
    owner = _owner()
    root = Path(tempfile.mkdtemp(prefix="sqla-jobs-pair-"))
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    pair = Pair(root, free_port(), free_port(), owner)
    started: list[str] = []
    try:
        pair.run(
            "initdb", "-D", "primary", "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"
        )
        started.append("primary")
        pair.start("primary", {})
        pair.run(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(pair.primary_port), "-U", "postgres"),
            *("-D", "standby", "-R", "-X", "stream", "--no-sync"),
        )
        started.append("standby")
        pair.start("standby", standby_settings or {})
        with pair.connect("standby") as standby:
            row = standby.execute("SELECT pg_is_in_recovery()").fetchone()
            assert row == (True,), "the standby is not in recovery"
        yield pair
    finally:
        for name in reversed(started):
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                pair.run("pg_ctl", "-D", name, "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
