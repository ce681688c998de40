"""Interrupted runs leave nothing behind: however a test run on the embedded PostgreSQL is stopped
(Ctrl-C, SIGTERM to pytest or to nox, SIGKILL to pytest or to an xdist controller), the servers it
started stop and their data directories go.

Each case runs a real pytest (under a real nox for the nox case) on a generated test that holds
the embedded server, with ``DATABASE_URL`` unset and a ``TMPDIR`` of its own: the servers and
directories it checks are only those under that ``TMPDIR`` (CI runs another suite beside this one,
on embedded servers of its own).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests._waiting import wait_until
from tests.acceptance._processes import REPO

pytestmark = pytest.mark.slow

#: Starting pytest and an embedded server (initdb included) on a loaded machine.
STARTUP = 90.0
#: Stopping the servers and removing their directories once the run is interrupted.
CLEANUP = 90.0

HOLDER = """\
import os
import time
from pathlib import Path


def test_holds_the_embedded_server(server_url):
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(os.environ["INTERRUPTED_RUN_MARKERS"], name).write_text(server_url)
    time.sleep(600)  # until the run is interrupted
"""


def servers(tmp: Path) -> list[psutil.Process]:
    """The postmasters whose data directory (``-D``) is under ``tmp``.

    A process the postmaster has just forked (a backend, an autovacuum worker) has its command
    line until it sets its own title: a process whose parent matches too is one of those."""
    found = []
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmd = proc.info["cmdline"] or []
        postmaster = cmd and Path(cmd[0]).name == "postgres" and "-D" in cmd[:-1]
        if postmaster and cmd[cmd.index("-D") + 1].startswith(f"{tmp}/"):
            found.append(proc)
    pids = {p.pid for p in found}
    return [p for p in found if p.info["ppid"] not in pids]


def data_dirs(tmp: Path) -> list[Path]:
    """The embedded servers' directories under ``tmp`` (devdb's ``sqla-jobs-pg-*``)."""
    return sorted(tmp.glob("sqla-jobs-pg-*"))


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Run:
    """A test run in a session of its own, on embedded servers under ``tmp``."""

    proc: subprocess.Popen[bytes]
    tmp: Path
    markers: Path
    log: Path

    def wait_servers_up(self, count: int) -> None:
        """Wait until ``count`` tests hold an embedded server each (or fail, showing the log)."""

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the run exited with {self.proc.returncode}:\n{self.output}")
            return len(list(self.markers.iterdir())) == count

        try:
            wait_until(up, f"{count} embedded server(s) up", timeout=STARTUP)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.output}") from None
        assert len(servers(self.tmp)) == count, "the servers are seen by their -D path"
        assert len(data_dirs(self.tmp)) == count

    def wait_nothing_left(self) -> None:
        """Wait until no server of this run runs and no data directory of it is left."""
        try:
            wait_until(
                lambda: not servers(self.tmp) and not data_dirs(self.tmp),
                "the run's servers stopped and their directories removed",
                timeout=CLEANUP,
            )
        except AssertionError as exc:
            left = [p.info["cmdline"] for p in servers(self.tmp)]
            raise AssertionError(
                f"{exc}\nservers: {left}\ndirs: {data_dirs(self.tmp)}\n{self.output}"
            ) from None

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_run(tmp_path: Path) -> Iterator[Callable[[list[str]], Run]]:
    """Start a command running the generated test (``{holder}`` in it stands for pytest's
    arguments); at the end, kill whatever of the run is left, servers included."""
    # Not under tmp_path: as root the server runs as another user, which must traverse the path,
    # and pytest keeps its own base directory private (0700).
    tmp = Path(tempfile.mkdtemp(prefix="sqla-jobs-interrupted-")).resolve()
    markers = tmp_path / "markers"
    markers.mkdir()
    (tmp_path / "test_holder.py").write_text(HOLDER)
    # The repository's conftest (the server fixtures, the SIGTERM hook) as a plugin.
    holder = ["-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path / "test_holder.py")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQLA_JOBS_", "PYTEST_"))}
    env.pop("DATABASE_URL", None)
    env["TMPDIR"] = str(tmp)
    env["INTERRUPTED_RUN_MARKERS"] = str(markers)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    # nox --no-venv runs "pytest" from PATH: this interpreter's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    started: list[Run] = []

    def start(command: list[str]) -> Run:
        at = command.index("{holder}")
        log = tmp_path / "run.log"
        with log.open("wb") as out:
            # A session of its own: a signal to its group reaches this run only. Ctrl-C as at a
            # terminal: an xdist worker (this test's process, under `nox -s tests`) ignores
            # SIGINT, and a child inherits that; a run started from a shell does not.
            proc = subprocess.Popen(
                [*command[:at], *holder, *command[at + 1 :]],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_default_sigint,
            )
        started.append(Run(proc, tmp, markers, log))
        return started[-1]

    try:
        yield start
    finally:
        for run in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait(10)
        # A server the run left behind (the test failed): a fast shutdown, then SIGKILL.
        left = servers(tmp)
        for proc in left:
            proc.send_signal(signal.SIGINT)
        for proc in psutil.wait_procs(left, timeout=10)[1]:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


PYTEST = [sys.executable, "-m", "pytest", "{holder}"]


def nox_command() -> list[str]:
    """How to run nox: this interpreter's, else the one on PATH (CI installs it beside Python)."""
    if importlib.util.find_spec("nox") is not None:
        return [sys.executable, "-m", "nox"]
    found = shutil.which("nox")
    if found is None:
        pytest.skip("nox is not installed")
    return [found]


def test_ctrl_c_stops_the_embedded_server_and_removes_its_data(
    start_run: Callable[[list[str]], Run],
) -> None:
    run = start_run(PYTEST)
    run.wait_servers_up(1)
    os.killpg(run.proc.pid, signal.SIGINT)  # a Ctrl-C reaches the terminal's foreground group
    run.wait_nothing_left()


def test_sigterm_to_pytest_stops_the_embedded_server_and_removes_its_data(
    start_run: Callable[[list[str]], Run],
) -> None:
    run = start_run(PYTEST)
    run.wait_servers_up(1)
    run.proc.terminate()
    run.wait_nothing_left()
    assert run.proc.wait(CLEANUP) != 0


def test_sigkill_to_pytest_stops_the_embedded_server_and_removes_its_data(
    start_run: Callable[[list[str]], Run],
) -> None:
    run = start_run(PYTEST)
    run.wait_servers_up(1)
    run.proc.kill()
    run.wait_nothing_left()


def test_sigterm_to_nox_stops_the_embedded_server_and_removes_its_data(
    start_run: Callable[[list[str]], Run], tmp_path: Path
) -> None:
    """nox does not forward a SIGTERM to the session's command."""
    nox = [*nox_command(), "-f", str(REPO / "noxfile.py"), "--envdir", str(tmp_path / "nox")]
    run = start_run([*nox, "--no-venv", "--no-install", "-s", "tests", "--", "{holder}"])
    run.wait_servers_up(1)
    run.proc.terminate()  # to nox alone
    run.wait_nothing_left()
    assert run.proc.wait(CLEANUP) != 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_an_xdist_controller_stops_its_workers_servers_and_removes_their_data(
    start_run: Callable[[list[str]], Run], sig: signal.Signals
) -> None:
    """Each of two workers holds a server of its own; the workers die with no finalizer run."""
    pytest.importorskip("xdist")
    run = start_run([*PYTEST[:-1], "-n", "2", "--dist", "each", "{holder}"])
    run.wait_servers_up(2)
    run.proc.send_signal(sig)  # to the controller alone
    run.wait_nothing_left()


def test_a_postmaster_s_fresh_fork_is_not_counted_as_another_server(tmp_path: Path) -> None:
    """A forked child keeps its parent's command line until it renames itself (a backend does at
    once, but not before a sampling can see it): only the parent is a server."""
    # sh's subshell is a fork that keeps the command line, as a postmaster's child does.
    script = "(sleep 60; true) & wait"
    proc = subprocess.Popen(["postgres", "-c", script, "-D", f"{tmp_path}/data"], executable="sh")
    try:

        def both_seen() -> bool:
            twins = [
                p
                for p in psutil.process_iter(["cmdline"])
                if (p.info["cmdline"] or [])[-1:] == [f"{tmp_path}/data"]
            ]
            return len(twins) == 2

        wait_until(both_seen, "the shell and its forked subshell")
        assert [p.pid for p in servers(tmp_path)] == [proc.pid]
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
