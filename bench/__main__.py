"""``python -m bench``: run the benchmark suite, print the table, write bench/results/.

The server is ``DATABASE_URL``'s, else an embedded PostgreSQL for the duration; every measurement
gets a fresh database on it, dropped afterwards. Targets are reported, never asserted: the exit code
is 0 unless a measurement could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from devdb import database_url
from sqla_jobs.db.urls import redact

from . import (
    commit_path,
    commit_path_lib,
    contention,
    delayed,
    drain,
    enqueue,
    growth,
    latency,
    memory,
    mvcc,
    prune,
    report,
    session,
    sustained,
)
from .dbs import server_info
from .figures import Outcome, Row
from .settings import FULL, QUICK, Context

#: In run order: the long sustained load last.
MEASUREMENTS: dict[str, Callable[[Context], Outcome]] = {
    "enqueue": enqueue.run,
    "drain": drain.run,
    "session": session.run,
    "latency": latency.run,
    "delayed": delayed.run,
    "mvcc": mvcc.run,
    "contention": contention.run,
    "commit_path": commit_path.run,
    "commit_path_library": commit_path_lib.measure,
    "memory": memory.run,
    "prune": prune.run,
    "growth": growth.run,
    "sustained": sustained.run,
}
RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="scaled-down sizes, for CI smoke runs")
    parser.add_argument(
        "--only",
        type=lambda s: [n.strip() for n in s.split(",") if n.strip()],
        default=None,
        metavar="NAME[,NAME]",
        help=f"run only these measurements: {', '.join(MEASUREMENTS)}",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="repetitions per measurement (default 3)"
    )
    parser.add_argument(
        "--sustained-seconds",
        type=float,
        default=None,
        help="length of the sustained load (default 180, --quick 15)",
    )
    parser.add_argument(
        "--sustained-rate",
        type=float,
        default=None,
        help="jobs per second of the sustained load (default 300, --quick 100)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [n for n in args.only or [] if n not in MEASUREMENTS]
    if unknown:
        parser.error(
            f"unknown measurement {', '.join(unknown)}; choose from {', '.join(MEASUREMENTS)}"
        )
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=RESULTS.parent
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def _tree() -> dict[str, Any]:
    """The commit, and whether sqla_jobs/ had uncommitted changes."""
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "sqla_jobs")),
    }


def meta(args: argparse.Namespace, url: str, names: list[str]) -> dict[str, Any]:
    return {
        "argv": sys.argv[1:],
        "quick": args.quick,
        "repeat": args.repeat,
        "measurements": names,
        "server": redact(url),
        "embedded": not os.environ.get("DATABASE_URL"),
        **server_info(url),
        "python": platform.python_version(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "loadavg_start": os.getloadavg(),
        "tree": _tree(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.only or list(MEASUREMENTS)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    failed: list[str] = []
    with database_url() as url:
        sizes = QUICK if args.quick else FULL
        if args.sustained_seconds is not None:
            sizes = dataclasses.replace(sizes, sustained_seconds=args.sustained_seconds)
        if args.sustained_rate is not None:
            sizes = dataclasses.replace(sizes, sustained_rate=args.sustained_rate)
        ctx = Context(
            server_url=url,
            sizes=sizes,
            repeat=args.repeat,
            quick=args.quick,
            results_dir=args.results_dir,
            stamp=stamp,
        )
        info = meta(args, url, names)
        ctx.log(
            f"server {info['server']} (PostgreSQL {info['server_version']}, "
            f"autovacuum={info['settings'].get('autovacuum')}); "
            f"{'quick' if args.quick else 'full'} sizes, {args.repeat} repetitions"
        )
        for name in names:
            ctx.log(f"== {name}")
            t0 = time.monotonic()
            try:
                outcome = MEASUREMENTS[name](ctx)
            except Exception:
                failed.append(name)
                raw[name] = {"error": traceback.format_exc()}
                ctx.log(f"{name} FAILED:\n{traceback.format_exc()}")
                continue
            rows += outcome.rows
            # Child processes import sqla_jobs when they start: record the tree each one saw.
            raw[name] = {**outcome.raw, "seconds": time.monotonic() - t0, "tree": _tree()}
    info["failed"] = failed
    info["loadavg_end"] = os.getloadavg()
    print(report.table(rows))
    path = report.write(args.results_dir, stamp, info, rows, raw)
    print(f"\nraw figures: {path} (and {path.parent / 'latest.json'})")
    if "sustained" in raw and "runs" in raw["sustained"]:
        png = report.plot_sustained(raw["sustained"], args.results_dir / f"{stamp}-sustained.png")
        if png is not None:
            print(f"sustained-run plot: {png}")
    if failed:
        print(f"measurements that could not run: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
