"""The commit path under many writers: what each wakeup design costs the enqueuing transactions.

pgbench plays many application servers enqueueing one job per transaction (``-M prepared``, the
statements sqla-jobs' single enqueue sends, compiled from :mod:`sqla_jobs.sql.enqueue`), for each
client count and each wakeup design:

- ``no wakeup``: BEGIN; INSERT; COMMIT (the reference);
- ``in-transaction NOTIFY``: BEGIN; the INSERT with ``pg_notify`` folded in; COMMIT. At commit
  PostgreSQL takes one database-wide lock (the notify queue's, ``Lock/object``) and holds it until
  the commit record is flushed, so these commits queue behind each other's WAL flush;
- ``after-commit notifier``: the writers as ``no wakeup``, and beside them a second pgbench, one
  client per simulated application process, sending ``SELECT pg_notify(channel, queue)`` as fast as
  it can, each in its own transaction with ``synchronous_commit = off`` (a worst case: the real
  notifier coalesces, one statement in flight per process);
- ``after-commit notifier, paced as the real one``: the same, the second pgbench paced
  (``pgbench -R``) at what the real notifier sends at most: one NOTIFY per enqueuing commit (the
  commits/s the writers reach with no wakeup, measured just before), and no more than one per
  :data:`sqla_jobs.enqueue.notifier.INTERVAL` per process;
- ``throttled in-transaction NOTIFY`` (River's design): the NOTIFY in the transaction, at most once
  per simulated process per 100 ms. Modelled on a clock: the INSERT also returns the 100 ms tick of
  the database's ``now()``; a process's ``k`` clients each notify when their own window
  ``(tick + client_id) / k`` changed since their last transaction, so each client notifies at most
  once per ``k`` ticks and, the windows being staggered by ``client_id``, the process about once
  per tick.

A process is :data:`CLIENTS_PER_PROCESS` clients. One listening connection consumes the
notifications (as a worker would). ``pg_stat_activity`` is sampled every 10 ms for the sessions
waiting on ``Lock/object``. Each run starts on an empty job table after a CHECKPOINT.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import literal_column
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ClauseElement, ColumnElement

from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.enqueue.notifier import INTERVAL
from sqla_jobs.model import notify_channel
from sqla_jobs.sql import enqueue as enqueue_sql

from .app import KIND
from .dbs import connect, fresh_database
from .figures import Outcome, Row, Series
from .settings import Context

VARIANTS = ("no_wakeup", "in_transaction", "after_commit", "after_commit_paced", "throttled")
LABELS = {
    "no_wakeup": "no wakeup",
    "in_transaction": "in-transaction NOTIFY",
    "after_commit": "after-commit notifier, unpaced",
    "after_commit_paced": "after-commit notifier, paced as the real one",
    "throttled": "throttled in-transaction NOTIFY",
}
#: The pgbench script each variant's writers run (see :func:`scripts`).
SCRIPT_OF = {
    "no_wakeup": "writer",
    "in_transaction": "notify",
    "after_commit": "writer",
    "after_commit_paced": "writer",
    "throttled": "throttled",
}
CLIENTS_PER_PROCESS = 8
#: The throttle's window, in ticks of 100 ms.
TICKS_PER_SECOND = 10
PGBENCH_NAMES = ("pgbench", "/usr/lib/postgresql/15/bin/pgbench")

#: The parameters enqueue binds for a ``ping`` job without options, as pgbench variables; the ones
#: that are NULL are written as NULL in the text (pgbench has no NULL variable).
VARIABLES = {
    "queue": "default",
    "kind": KIND,
    "payload": '{"n": 1, "tag": "bench"}',
    "priority": "0",
    "delay_us": "0",
    "max_attempts": "10",
    "max_crashes": "3",
    "channel": notify_channel(None),
    "queue_name": "default",
}
NULLS = ("run_at", "concurrency_key", "concurrency_limit")
_TICK: ColumnElement[Any] = literal_column(
    f"(extract(epoch from now()) * {TICKS_PER_SECOND})::bigint"
).label("tick")


def pgbench_sql(stmt: ClauseElement) -> str:
    """``stmt`` compiled as psycopg would send it, its parameters as pgbench ``:variables``."""
    text = str(stmt.compile(dialect=postgresql.psycopg.dialect()))  # type: ignore[no-untyped-call]

    def param(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in NULLS:
            return "NULL"
        if name not in VARIABLES:
            raise KeyError(f"no pgbench variable for parameter {name!r}")
        return f":{name}"

    return " ".join(re.sub(r"%\((\w+)\)s", param, text).split())


def scripts() -> dict[str, str]:
    """The pgbench scripts: ``writer`` (no wakeup, and the after-commit writers), ``notify`` (the
    in-transaction NOTIFY), ``throttled`` and ``notifier`` (the after-commit notifier)."""
    plain = pgbench_sql(enqueue_sql.insert_job(lean=True))
    folded = pgbench_sql(enqueue_sql.insert_job_and_notify(lean=True))
    plain_tick = pgbench_sql(enqueue_sql.insert_job(lean=True).returning(_TICK))
    folded_tick = pgbench_sql(enqueue_sql.insert_job_and_notify(lean=True).add_columns(_TICK))
    return {
        "writer": f"BEGIN;\n{plain};\nCOMMIT;\n",
        "notify": f"BEGIN;\n{folded};\nCOMMIT;\n",
        "throttled": (
            "\\set window (:tick + :client_id) / :k\n"
            # The first transaction only starts the client's clock: without it every client
            # notifies at once at the start, which no throttle of a running process does.
            "\\if :last = -1\n"
            "\\set last :window\n"
            "\\endif\n"
            "\\if :window != :last\n"
            "\\set last :window\n"
            f"BEGIN;\n{folded_tick} \\gset\nCOMMIT;\n"
            "\\else\n"
            f"BEGIN;\n{plain_tick} \\gset\nCOMMIT;\n"
            "\\endif\n"
        ),
        "notifier": "SELECT pg_notify(:channel, :queue_name);\n",
    }


def pgbench_path() -> str:
    for name in PGBENCH_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError("pgbench not found (PATH, /usr/lib/postgresql/15/bin)")


@dataclass(frozen=True)
class Bench:
    """One pgbench process."""

    proc: subprocess.Popen[str]

    def result(self) -> dict[str, float]:
        out, err = self.proc.communicate(timeout=600)
        if self.proc.returncode != 0:
            raise RuntimeError(f"pgbench failed ({self.proc.returncode}): {err.strip()[-2000:]}")
        tps = re.search(r"^tps = ([\d.]+)", out, re.MULTILINE)
        done = re.search(r"^number of transactions actually processed: (\d+)", out, re.MULTILINE)
        if tps is None or done is None:
            raise RuntimeError(f"pgbench printed no tps:\n{out}\n{err}")
        return {"tps": float(tps.group(1)), "transactions": float(done.group(1))}


def start_pgbench(
    conninfo: str,
    script: Path,
    clients: int,
    seconds: float,
    variables: dict[str, str],
    env: dict[str, str] | None = None,
    rate: float | None = None,
) -> Bench:
    args = [
        pgbench_path(),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(2, clients)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(script),
    ]
    if rate is not None:
        args += ["-R", str(max(1, round(rate)))]
    for name, value in variables.items():
        args += ["-D", f"{name}={value}"]
    args.append(conninfo)
    return Bench(
        subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env} if env else None,
        )
    )


class LockSampler(threading.Thread):
    """Samples ``pg_stat_activity`` every ``every`` seconds: sessions of this database waiting on
    ``Lock/object`` (the notify queue's lock), and on any lock."""

    def __init__(self, url: str, every: float = 0.010) -> None:
        super().__init__(name="lock-sampler", daemon=True)
        self.url = url
        self.every = every
        self.object_waits: list[int] = []
        self.lock_waits: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with connect(self.url) as conn:
            conn.prepare_threshold = 0
            while not self._stop_event.is_set():
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock' "
                    "AND wait_event = 'object'), count(*) FILTER (WHERE wait_event_type = 'Lock') "
                    "FROM pg_stat_activity WHERE datname = current_database()"
                ).fetchone()
                if row is not None:
                    self.object_waits.append(int(row[0]))
                    self.lock_waits.append(int(row[1]))
                self._stop_event.wait(self.every)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


class Listener(threading.Thread):
    """A LISTEN connection that consumes and counts the notifications, as a worker would."""

    def __init__(self, url: str) -> None:
        super().__init__(name="listener", daemon=True)
        self.url = url
        self.count = 0
        self.ready = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        with connect(self.url) as conn:
            conn.execute(f'LISTEN "{VARIABLES["channel"]}"')
            self.ready.set()
            while not self._stop_event.is_set():
                self.count += sum(1 for _ in conn.notifies(timeout=0.1))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def run_variant(
    url: str, workdir: Path, variant: str, clients: int, seconds: float, pace: float = 0.0
) -> dict[str, float]:
    """One pgbench run (two for the after-commit notifier) on an emptied job table; ``pace``:
    the commits/s of the writers without wakeup, at which the paced notifier sends (one
    NOTIFY per commit, nothing coalesced: what the real notifier sends at most)."""
    conninfo = libpq_conninfo(url)
    with connect(url) as conn:
        conn.execute("TRUNCATE sqla_jobs_job")
        with contextlib.suppress(psycopg.Error):
            conn.execute("CHECKPOINT")
    processes = max(1, clients // CLIENTS_PER_PROCESS)
    per_process = max(1, clients // processes)
    script = SCRIPT_OF[variant]
    variables = dict(VARIABLES)
    if variant == "throttled":
        tick = int(time.time() * TICKS_PER_SECOND)
        variables.update(k=str(per_process), tick=str(tick), last="-1")
    listener = Listener(url)
    listener.start()
    listener.ready.wait(10)
    sampler = LockSampler(url)
    sampler.start()
    try:
        writers = start_pgbench(conninfo, workdir / f"{script}.sql", clients, seconds, variables)
        notifier = None
        if variant in ("after_commit", "after_commit_paced"):
            notifier = start_pgbench(
                conninfo,
                workdir / "notifier.sql",
                processes,
                seconds,
                VARIABLES,
                env={"PGOPTIONS": "-c synchronous_commit=off"},
                # The real notifier sends at most once per INTERVAL per process, coalesced.
                rate=min(pace, processes / INTERVAL) if variant == "after_commit_paced" else None,
            )
        result = writers.result()
        extra = notifier.result() if notifier is not None else None
    finally:
        sampler.stop()
        time.sleep(0.2)
        listener.stop()
    waits = sampler.object_waits or [0]
    return {
        "commits_per_s": result["tps"],
        "notifier_per_s": extra["tps"] if extra else 0.0,
        "notifications": float(listener.count),
        "peak_object_waits": float(max(waits)),
        "mean_object_waits": sum(waits) / len(waits),
        "peak_lock_waits": float(max(sampler.lock_waits or [0])),
        "samples": float(len(sampler.object_waits)),
    }


@contextlib.contextmanager
def script_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sqla_jobs_bench_pgbench_") as tmp:
        path = Path(tmp)
        for name, text in scripts().items():
            (path / f"{name}.sql").write_text(text)
        yield path


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    seconds = sizes.commit_path_seconds
    figures = {
        (c, v): {k: Series() for k in ("rate", "peak", "mean", "notifications", "notifier")}
        for c in sizes.commit_path_clients
        for v in VARIANTS
    }
    raw: dict[str, Any] = {"seconds": seconds, "scripts": scripts(), "runs": []}
    with script_dir() as workdir:
        for rep in range(ctx.repeat):
            with fresh_database(ctx.server_url, "sqla_jobs") as url:
                for i, clients in enumerate(sizes.commit_path_clients):
                    # The paced notifier's rate: what these writers commit with no wakeup.
                    pace = run_variant(url, workdir, "no_wakeup", clients, seconds / 2)[
                        "commits_per_s"
                    ]
                    # Rotate the order per client count and repetition: drift favours no one.
                    shift = (rep + i) % len(VARIANTS)
                    for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                        r = run_variant(url, workdir, variant, clients, seconds, pace)
                        f = figures[(clients, variant)]
                        f["rate"].add(r["commits_per_s"])
                        f["peak"].add(r["peak_object_waits"])
                        f["mean"].add(r["mean_object_waits"])
                        f["notifications"].add(r["notifications"] / seconds)
                        f["notifier"].add(r["notifier_per_s"])
                        raw["runs"].append(
                            {"rep": rep, "clients": clients, "variant": variant, **r}
                        )
                        ctx.log(
                            f"commit_path c={clients} {variant} rep {rep + 1}: "
                            f"{r['commits_per_s']:,.0f} commits/s, notifications "
                            f"{r['notifications'] / seconds:,.0f}/s, notifier "
                            f"{r['notifier_per_s']:,.0f}/s, Lock/object waiters peak "
                            f"{r['peak_object_waits']:.0f} mean {r['mean_object_waits']:.2f}"
                        )
    rows: list[Row] = []
    for clients in sizes.commit_path_clients:
        base = figures[(clients, "no_wakeup")]
        procs = max(1, clients // CLIENTS_PER_PROCESS)
        head = f"{clients} client{'s' if clients > 1 else ''} ({procs} process{'es' if procs > 1 else ''})"
        for variant in VARIANTS[1:]:
            f = figures[(clients, variant)]
            note = ""
            if variant in ("after_commit", "after_commit_paced"):
                note = f"notifier {f['notifier'].median:,.0f} NOTIFY/s beside the writers"
            elif variant == "throttled":
                note = f"{f['notifications'].median:,.0f} NOTIFY/s let through"
            rows.append(
                Row(
                    "commit_path",
                    f"{head}: {LABELS[variant]} vs no wakeup",
                    "commits/s",
                    f["rate"],
                    base["rate"],
                    "no wakeup",
                    note=note,
                    subject_label=LABELS[variant],
                )
            )
        for variant in VARIANTS:
            rows.append(
                Row(
                    "commit_path",
                    f"{head}: peak sessions waiting on Lock/object, {LABELS[variant]}",
                    "sessions",
                    figures[(clients, variant)]["peak"],
                    subject_label=LABELS[variant],
                )
            )
    from . import commit_path_lib  # it imports this module's Listener and LockSampler

    return Outcome(rows + commit_path_lib.run(ctx, raw), raw)
