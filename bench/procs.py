"""Child processes (workers, enqueuers) and what /proc says about them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")


def memory_kb(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of ``pid``, in KiB; empty once the process is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def cpu_seconds(pid: int | str = "self") -> float:
    """User plus system CPU time of ``pid`` (all its threads), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / _TICKS


class Child:
    """``python -m bench.child ARGS`` (or another ``module``): it prints ``ready`` once set up,
    starts on ``go`` and stops on ``stop`` (both on stdin), then prints one JSON line with its
    result and exits."""

    def __init__(self, *args: str, module: str = "bench.child") -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.pid = self.proc.pid

    def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.daemon = True
        reader.start()
        reader.join(timeout)
        if not result:
            raise TimeoutError(f"child {self.pid} said nothing for {timeout:g}s")
        if not result[0]:
            raise RuntimeError(f"child {self.pid} exited with {self.proc.wait()}")
        return result[0].strip()

    def _send(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.expect("ready", timeout)

    def expect(self, word: str, timeout: float = 60.0) -> None:
        """Wait for the child to print ``word``."""
        line = self._line(timeout)
        if line != word:
            raise RuntimeError(f"child {self.pid}: expected {word!r}, got {line!r}")

    def go(self) -> None:
        self._send("go")

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """Tell it to stop; return its JSON result."""
        self._send("stop")
        return self.result(timeout)

    def result(self, timeout: float = 600.0) -> dict[str, Any]:
        """Wait for the child's JSON line and its exit."""
        line = self._line(timeout)
        self.proc.wait(timeout)
        data: dict[str, Any] = json.loads(line)
        return data

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Children:
    """A group of children that are killed if the measurement fails half-way."""

    def __init__(self) -> None:
        self.items: list[Child] = []

    def spawn(self, *args: str) -> Child:
        child = Child(*args)
        self.items.append(child)
        return child

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in self.items:
            child.kill()


class RssSampler(threading.Thread):
    """Samples a process's VmRSS every ``every`` seconds until stopped."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        super().__init__(name=f"rss-{pid}", daemon=True)
        self.pid = pid
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self.hwm_kb = 0
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._stop_event.is_set():
            mem = memory_kb(self.pid)
            if "VmRSS" in mem:
                self.samples.append((time.monotonic() - self._t0, mem["VmRSS"]))
                self.hwm_kb = max(self.hwm_kb, mem.get("VmHWM", 0))
            self._stop_event.wait(self.every)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)
