"""Growth: the drain, the idle pickup and an idle worker's server CPU when the table is big.

Each backlog is loaded fast (``INSERT ... SELECT generate_series``, then ``VACUUM ANALYZE``) into
the sqla-jobs table and, the same rows, into the baseline's ``jobs`` table. The jobs drained are
loaded first with the earliest ``run_at``, so both claims take them first; the drain's clock runs
from "go" until none of them is left (:func:`drained`), one worker process at concurrency 4 (the
baseline: 4 batched claim loops), as :mod:`bench.drain` runs it. Then, in the same database, an
idle listening worker's pickup (:mod:`bench.latency`): on the queue that holds the backlog when
nothing of it is due any more (scheduled and dead rows, and the 20k due once drained), else on a
queue of its own beside it (a due backlog in the same queue would keep the worker busy; the
baseline has no queues, so it has no figure there). Last, the server CPU of an idle worker (the
backends serving it, read from ``/proc``, local servers only), polling every second, serving 1 and
50 queues, on an empty table and with 2M jobs scheduled a day ahead (spread over the 50 queues).

With more than one repetition each backlog is loaded once into a template and copied per
repetition (``CREATE DATABASE ... TEMPLATE``).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from sqla_jobs.db.urls import libpq_conninfo, with_database

from .dbs import PREFIX, TABLE, Subject, connect, fresh_database
from .drain import IMPLS, backend_cpu
from .figures import Outcome, Row, Series, percentile
from .latency import latencies, listening_worker
from .procs import Children, cpu_seconds
from .settings import Context, Sizes

CONCURRENCY = 4
#: The worker child each subject drains with: sqla-jobs', or the baseline's batched loops.
IMPL: dict[Subject, str] = {"sqla_jobs": "sqla", "baseline": "batched"}
PICKUP_QUEUE = "pickup"


@dataclass(frozen=True)
class Backlog:
    """What the table holds: ``due`` due jobs (the first ``drain`` of them drained), optionally
    keyed over ``keys`` keys (limit 1), beside ``scheduled`` jobs a day ahead and ``dead`` ones."""

    name: str
    due: int
    drain: int
    scheduled: int = 0
    dead: int = 0
    keys: int = 0

    @property
    def total(self) -> int:
        return self.due + self.scheduled + self.dead

    @property
    def idle_after_drain(self) -> bool:
        """Whether nothing is due once the drain is over (the pickup can use the same queue)."""
        return self.due == self.drain

    def label(self) -> str:
        parts = [f"{_n(self.due)} due" + (f" over {_n(self.keys)} keys" if self.keys else "")]
        if self.scheduled:
            parts.append(f"{_n(self.scheduled)} scheduled a day ahead")
        if self.dead:
            parts.append(f"{_n(self.dead)} dead")
        return " + ".join(parts)


def _n(count: int) -> str:
    if count >= 1_000_000 and count % 1_000_000 == 0:
        return f"{count // 1_000_000}M"
    if count >= 1_000 and count % 1_000 == 0:
        return f"{count // 1_000}k"
    return f"{count:,}"


def backlogs(sizes: Sizes) -> list[Backlog]:
    d, big = sizes.growth_drain, sizes.growth_big
    every = [
        Backlog("due", d, d),
        Backlog("due_10x", 10 * d, d),
        Backlog("due_big", big, d),
        Backlog("scheduled", d, d, scheduled=big),
        Backlog("dead", d, d, dead=sizes.growth_dead),
        Backlog("keyed", 10 * d, d, keys=sizes.growth_keys),
    ]
    wanted = sizes.growth_backlogs
    return [b for b in every if wanted is None or b.name in wanted]


# -- loading ----------------------------------------------------------------------------------


def _sqla_rows(first: int, count: int, *, state: str, run_at: str, keys: int = 0) -> str:
    key = f"'k' || (i % {keys}), 1" if keys else "NULL, NULL"
    finished = "now()" if state == "dead" else "NULL"
    attempts = 10 if state == "dead" else 0
    return (
        "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at, max_attempts, "
        "max_crashes, concurrency_key, concurrency_limit, state, attempts, finished_at) "
        f"SELECT 'default', 'ping', jsonb_build_object('n', i, 'tag', 'bench'), 0, {run_at}, 10, "
        f"3, {key}, '{state}', {attempts}, {finished} "
        f"FROM generate_series({first}, {first + count - 1}) i"
    )


def _baseline_rows(first: int, count: int, *, state: str, run_at: str) -> str:
    return (
        "INSERT INTO jobs (kind, payload, state, run_at, max_attempts) "
        f"SELECT 'ping', jsonb_build_object('n', i, 'tag', 'bench'), '{state}', {run_at}, 5 "
        f"FROM generate_series({first}, {first + count - 1}) i"
    )


#: run_at of the i-th row: the due ones in the past in load order (so the first loaded are
#: claimed first), the scheduled ones a day ahead.
DUE_AT = "now() - interval '1 day' + i * interval '1 ms'"
LATER_AT = "now() + interval '1 day' + i * interval '1 ms'"


def load(conn: psycopg.Connection[Any], subject: Subject, backlog: Backlog) -> None:
    """Fill the queue table with ``backlog``, ids 1.. in load order; then VACUUM ANALYZE."""
    parts: list[tuple[int, str, str]] = [(backlog.due, "pending", DUE_AT)]
    if backlog.scheduled:
        parts.append((backlog.scheduled, "pending", LATER_AT))
    if backlog.dead:
        parts.append((backlog.dead, "dead", DUE_AT))
    first = 1
    for count, state, run_at in parts:
        if subject == "sqla_jobs":
            keys = backlog.keys if state == "pending" and run_at == DUE_AT else 0
            conn.execute(_sqla_rows(first, count, state=state, run_at=run_at, keys=keys).encode())
        else:
            conn.execute(_baseline_rows(first, count, state=state, run_at=run_at).encode())
        first += count
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(TABLE[subject])))


def load_spread(conn: psycopg.Connection[Any], count: int, queues: int) -> None:
    """``count`` sqla-jobs rows scheduled a day ahead, spread over the idle worker's ``queues``
    (``default``, ``default1``, ...)."""
    names = "ARRAY['default'" + "".join(f", 'default{i}'" for i in range(1, queues)) + "]"
    conn.execute(
        "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at, max_attempts, "
        f"max_crashes) SELECT ({names})[1 + i % {queues}], 'ping', "
        f"jsonb_build_object('n', i, 'tag', 'bench'), 0, {LATER_AT}, 10, 3 "
        f"FROM generate_series(1, {count}) i".encode()
    )
    conn.execute("VACUUM ANALYZE sqla_jobs_job")


@contextlib.contextmanager
def copy_of(server_url: str, template: str, *, reuse: bool) -> Iterator[str]:
    """A database holding what ``template`` holds, dropped on exit: the template itself when
    ``reuse`` (the last use of it), else a copy (``CREATE DATABASE ... TEMPLATE``)."""
    if reuse:
        yield template
        return
    tmpl = conninfo_to_dict(libpq_conninfo(template))["dbname"]
    name = f"{PREFIX}_{os.getpid()}_{secrets.token_hex(4)}"
    with connect(server_url) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(str(tmpl))
            )
        )
    try:
        yield with_database(server_url, name)
    finally:
        _drop(server_url, name)


def _drop(server_url: str, name: str) -> None:
    with connect(server_url) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


# -- measuring --------------------------------------------------------------------------------


def drained(conn: psycopg.Connection[Any], table: str, last_id: int) -> bool:
    """Whether none of the jobs with ids up to ``last_id`` (the drained ones) is left."""
    row = conn.execute(
        sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {} WHERE id <= %s)").format(
            sql.Identifier(table)
        ),
        (last_id,),
    ).fetchone()
    return bool(row and row[0])


def drain_first(url: str, impl: str, jobs: int, *, keyed: bool = False) -> dict[str, float]:
    """Run one worker process (``impl``) at :data:`CONCURRENCY` until jobs 1..``jobs`` are gone."""
    subject = IMPLS[impl]
    with Children() as children, connect(url) as conn:
        # A keyed backlog's worker registers the kind with a limit: it only then runs keyed claims.
        limit = ["--concurrency-limit", "1"] if keyed else []
        child = children.spawn(
            "worker", "--impl", impl, "--url", url, "--loops", str(CONCURRENCY), *limit
        )
        child.wait_ready()
        cpu0 = cpu_seconds(child.pid)
        t0 = time.perf_counter()
        child.go()
        deadline = time.monotonic() + max(120.0, jobs / 50)
        while not drained(conn, TABLE[subject], jobs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"drain {impl}: jobs 1..{jobs} not done in time")
            time.sleep(0.01)
        t1 = time.perf_counter()
        cpu = cpu_seconds(child.pid) - cpu0
        server = backend_cpu(conn)
        result = child.finish()
    if result.get("errors"):
        raise RuntimeError(f"drain {impl}: errors {result['errors']}")
    return {
        "rate": jobs / (t1 - t0),
        "cpu_us_per_job": cpu / jobs * 1e6,
        "server_cpu_us_per_job": server / jobs * 1e6,
    }


def pickup(ctx: Context, subject: Subject, url: str, backlog: Backlog) -> tuple[list[float], int]:
    """The idle pickup after the drain (see the module's docstring for the queue it uses)."""
    table = TABLE[subject]
    queue = "default" if backlog.idle_after_drain else PICKUP_QUEUE

    def idle(conn: psycopg.Connection[Any]) -> None:
        # The pickup's jobs are the ones after the backlog's ids.
        deadline = time.monotonic() + 15
        while not drained_after(conn, table, backlog.total):
            if time.monotonic() > deadline:
                raise TimeoutError("the pickup's jobs were not all run")
            time.sleep(0.01)

    sizes = ctx.sizes
    return latencies(
        subject,
        url,
        sizes.growth_pickup_jobs,
        sizes.latency_gap,
        queue=queue,
        idle_table=idle,
    )


def drained_after(conn: psycopg.Connection[Any], table: str, last_id: int) -> bool:
    row = conn.execute(
        sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {} WHERE id > %s)").format(sql.Identifier(table)),
        (last_id,),
    ).fetchone()
    return bool(row and row[0])


def idle_cpu(url: str, subject: Subject, queues: int, seconds: float) -> float:
    """Server CPU (% of one core) of the backends serving an idle worker polling every second."""
    with listening_worker(subject, url, poll=1.0, queues=queues) as child, connect(url) as conn:
        # Past the worker's start-up (its first claims, its connections' first statements).
        time.sleep(min(1.5, seconds))
        cpu0, t0 = backend_cpu(conn), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = backend_cpu(conn), time.monotonic()
        child.finish()
    return (cpu1 - cpu0) / (t1 - t0) * 100


# -- the run ----------------------------------------------------------------------------------


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    out = Outcome()
    subjects: tuple[Subject, Subject] = ("sqla_jobs", "baseline")
    cpu_rows: dict[str, dict[str, Series]] = {}
    local = not math.isnan(backend_cpu_probe(ctx.server_url))
    for backlog in backlogs(sizes):
        rate = {s: Series() for s in subjects}
        p50 = {s: Series() for s in subjects}
        p99 = {s: Series() for s in subjects}
        with contextlib.ExitStack() as stack:
            templates: dict[Subject, str] = {}
            for subject in subjects:
                templates[subject] = stack.enter_context(fresh_database(ctx.server_url, subject))
                t0 = time.monotonic()
                with connect(templates[subject]) as conn:
                    load(conn, subject, backlog)
                ctx.log(
                    f"growth {backlog.name} {subject}: loaded {backlog.label()} in "
                    f"{time.monotonic() - t0:.1f} s"
                )
            for rep in range(ctx.repeat):
                # Alternate who goes first, so a drifting machine does not favour one side.
                for subject in subjects if rep % 2 == 0 else subjects[::-1]:
                    last = rep == ctx.repeat - 1
                    with copy_of(ctx.server_url, templates[subject], reuse=last) as url:
                        msg = measure(ctx, subject, url, backlog, local, cpu_rows)
                    r = msg.pop("figures")
                    rate[subject].add(r["rate"])
                    if "p50" in r:
                        p50[subject].add(r["p50"])
                        p99[subject].add(r["p99"])
                    ctx.log(f"growth {backlog.name} {subject} rep {rep + 1}: drain {msg['text']}")
        label = backlog.label()
        drain_row = Row(
            "growth",
            f"drain the first {_n(backlog.drain)} of {label}, concurrency {CONCURRENCY}, 1 process "
            "vs batched claim",
            "jobs/s",
            rate["sqla_jobs"],
            rate["baseline"],
            "batched (4 loops)",
        )
        if backlog.keys:
            drain_row.note = (
                "keyed drain, limit 1 per key; the baseline has no concurrency keys: it drains "
                "the same rows unkeyed"
            )
        out.rows.append(drain_row)
        where = (
            "same queue" if backlog.idle_after_drain else "a queue of its own beside the backlog"
        )
        for q, series in ((50, p50), (99, p99)):
            row = Row(
                "growth",
                f"pickup p{q} after that drain, {label} ({where}), idle listening worker",
                "ms",
                series["sqla_jobs"],
                series["baseline"] if series["baseline"].samples else None,
                "LISTEN worker" if series["baseline"].samples else "",
            )
            if not series["baseline"].samples:
                row.note = "no baseline: its claim has no queues, so the due backlog keeps it busy"
            out.rows.append(row)
        out.raw[backlog.name] = {
            "label": label,
            "rate": {s: rate[s].as_dict() for s in subjects},
            "p50": {s: p50[s].as_dict() for s in subjects},
            "p99": {s: p99[s].as_dict() for s in subjects},
        }
    out.rows += idle_cpu_rows(ctx, cpu_rows)
    return out


def measure(
    ctx: Context,
    subject: Subject,
    url: str,
    backlog: Backlog,
    local: bool,
    cpu_rows: dict[str, dict[str, Series]],
) -> dict[str, Any]:
    """The drain, then the pickup (where the baseline has one), then for the scheduled backlog on
    a local server the idle worker's CPU, in ``url``; the figures and a line for the log."""
    sizes = ctx.sizes
    keyed = bool(backlog.keys) and subject == "sqla_jobs"
    r = drain_first(url, IMPL[subject], backlog.drain, keyed=keyed)
    figures: dict[str, float] = {"rate": r["rate"]}
    text = f"{r['rate']:,.0f} jobs/s"
    if subject == "sqla_jobs" or backlog.idle_after_drain:
        lat, missing = pickup(ctx, subject, url, backlog)
        figures.update(p50=percentile(lat, 50), p99=percentile(lat, 99))
        text += (
            f", pickup p50 {figures['p50']:.2f} ms, p99 {figures['p99']:.2f} ms, "
            f"{missing} never started"
        )
    if backlog.name == "scheduled" and local:
        for queues in _queue_counts(subject, sizes):
            cpu = idle_cpu(url, subject, queues, sizes.growth_cpu_seconds)
            series = cpu_rows.setdefault(f"{queues}:scheduled", {})
            series.setdefault(subject, Series()).add(cpu)
            text += f", idle worker ({queues} queues) server CPU {cpu:.2f}%"
    return {"figures": figures, "text": text}


def _queue_counts(subject: Subject, sizes: Sizes) -> tuple[int, ...]:
    # The baseline has no queues: its idle worker is measured once.
    return (1,) if subject == "baseline" else (1, sizes.growth_idle_queues)


def backend_cpu_probe(url: str) -> float:
    """The CPU of this connection's own backend: NaN when the server is not local."""
    with connect(url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        return cpu_seconds(int(row[0])) if row else math.nan


def idle_cpu_rows(ctx: Context, cpu: dict[str, dict[str, Series]]) -> list[Row]:
    """Idle worker CPU on an empty table (measured here), beside the 2M-scheduled figures."""
    sizes = ctx.sizes
    subjects: tuple[Subject, Subject] = ("sqla_jobs", "baseline")
    if math.isnan(backend_cpu_probe(ctx.server_url)):
        ctx.log("growth: idle CPU skipped (the server is not local)")
        return []
    for rep in range(ctx.repeat):
        for subject in subjects if rep % 2 == 0 else subjects[::-1]:
            with fresh_database(ctx.server_url, subject) as url:
                for queues in _queue_counts(subject, sizes):
                    got = idle_cpu(url, subject, queues, sizes.growth_cpu_seconds)
                    cpu.setdefault(f"{queues}:empty", {s: Series() for s in subjects})[subject].add(
                        got
                    )
                    ctx.log(f"growth idle {subject} {queues} queues, empty: server CPU {got:.2f}%")
        with fresh_database(ctx.server_url, "sqla_jobs") as url:
            with connect(url) as conn:
                load_spread(conn, sizes.growth_big, sizes.growth_idle_queues)
            queues = sizes.growth_idle_queues
            got = idle_cpu(url, "sqla_jobs", queues, sizes.growth_cpu_seconds)
            cpu.setdefault(f"{queues}:spread", {s: Series() for s in subjects})["sqla_jobs"].add(
                got
            )
            ctx.log(
                f"growth idle sqla_jobs {queues} queues, {_n(sizes.growth_big)} spread: {got:.2f}%"
            )
    big = _n(sizes.growth_big)
    labels = {
        "1:empty": "1 queue, empty table",
        "1:scheduled": f"1 queue, {big} scheduled a day ahead in it",
        f"{sizes.growth_idle_queues}:empty": f"{sizes.growth_idle_queues} queues, empty table",
        f"{sizes.growth_idle_queues}:scheduled": (
            f"{sizes.growth_idle_queues} queues, {big} scheduled a day ahead in one of them"
        ),
        f"{sizes.growth_idle_queues}:spread": (
            f"{sizes.growth_idle_queues} queues, {big} scheduled a day ahead spread over them"
        ),
    }
    rows = []
    for key, label in labels.items():
        if key not in cpu:
            continue
        base = cpu[key].get("baseline", Series())
        rows.append(
            Row(
                "growth",
                f"server CPU of an idle worker polling every 1 s, {label}",
                "% core",
                cpu[key].get("sqla_jobs", Series()),
                base if base.samples else None,
                "LISTEN worker, 1 s poll" if base.samples else "",
                note="" if base.samples else "no baseline: it has no queues",
            )
        )
    return rows
