"""Handlers that write one row: through their own Session, or through the worker's, whose
transaction also completes the job.

Each drain is the drain measurement's (:func:`bench.drain.drain_in`: one worker child process,
the clock from "go" to an empty job table, CPU of the worker and of the backends serving it), of
``session_jobs`` pre-enqueued jobs in a fresh database that also holds an application table,
``bench_app_row``. The handlers (:data:`bench.app.HANDLERS`), sync and async:

- ``noop``: nothing, the reference;
- ``plain``: ``(payload, ctx)`` inserts one row through a Session of its own and commits; the
  worker then completes the job in its batched write (what users do without the feature);
- ``session``: ``(payload, ctx, session)`` inserts the same row through the worker's Session; the
  job's fenced DELETE runs in that transaction, and one commit makes both durable.

After each drain the table must hold exactly one row per job. The handlers run in the same order
within a repetition, reversed from one repetition to the next.
"""

from __future__ import annotations

import math
from typing import Any

from .app import APP_DDL, APP_TABLE, HANDLERS, prefill
from .dbs import connect, count_rows, fresh_database
from .drain import drain_in
from .figures import Outcome, Row, Series
from .settings import Context

FIGURES = ("rate", "cpu_us_per_job", "server_cpu_us_per_job")


def once(ctx: Context, handler: str, concurrency: int, jobs: int) -> dict[str, float]:
    """One drain of ``jobs`` jobs by ``handler`` at ``concurrency``, in a fresh database."""
    with fresh_database(ctx.server_url, "sqla_jobs") as url:
        with connect(url) as conn:
            conn.execute(APP_DDL)
        prefill("sqla_jobs", url, jobs)
        r = drain_in(url, "sqla", concurrency, 1, jobs, "--handler", handler)
        with connect(url) as conn:
            rows = count_rows(conn, APP_TABLE)
    expected = 0 if handler.startswith("noop") else jobs
    if rows != expected:
        raise RuntimeError(f"session {handler}: {rows} rows in {APP_TABLE}, expected {expected}")
    return r


def _rows(label: str, flavour: str, s: dict[str, dict[str, Series]]) -> list[Row]:
    """The rows of one flavour (sync or async) at one concurrency."""
    suffix = "" if flavour == "sync" else "-async"
    noop, plain, session = (s[h + suffix] for h in ("noop", "plain", "session"))
    rows = [
        Row(
            "session",
            f"{label}, {flavour}: jobs/s, Session handler vs own Session",
            "jobs/s",
            session["rate"],
            plain["rate"],
            "own Session",
            subject_label="session",
        ),
        Row(
            "session",
            f"{label}, {flavour}: worker CPU per job, Session handler vs own Session",
            "us/job",
            session["cpu_us_per_job"],
            plain["cpu_us_per_job"],
            "own Session",
            subject_label="session",
            note=f"no-op: {noop['cpu_us_per_job'].median:.0f} us/job",
        ),
    ]
    if session["server_cpu_us_per_job"].samples and plain["server_cpu_us_per_job"].samples:
        rows.append(
            Row(
                "session",
                f"{label}, {flavour}: server CPU per job, Session handler vs own Session",
                "us/job",
                session["server_cpu_us_per_job"],
                plain["server_cpu_us_per_job"],
                "own Session",
                subject_label="session",
                note=f"no-op: {noop['server_cpu_us_per_job'].median:.0f} us/job (local "
                "servers only)",
            )
        )
    for name, series in (("own Session", plain), ("Session handler", session)):
        rows.append(
            Row(
                "session",
                f"{label}, {flavour}: jobs/s, {name} vs no-op",
                "jobs/s",
                series["rate"],
                noop["rate"],
                "no-op handler",
                subject_label="plain" if series is plain else "session",
            )
        )
    return rows


def run(ctx: Context) -> Outcome:
    sizes = ctx.sizes
    jobs = sizes.session_jobs
    out = Outcome()
    for concurrency in sizes.drain_concurrency:
        s = {h: {f: Series() for f in FIGURES} for h in HANDLERS}
        for rep in range(ctx.repeat):
            # Reversed every other repetition, so drift favours neither side of a pair.
            for handler in HANDLERS if rep % 2 == 0 else HANDLERS[::-1]:
                r = once(ctx, handler, concurrency, jobs)
                for f in FIGURES:
                    if not math.isnan(r[f]):
                        s[handler][f].add(r[f])
                ctx.log(
                    f"session c={concurrency} {handler} rep {rep + 1}: {r['rate']:,.0f} jobs/s, "
                    f"worker CPU {r['cpu_us_per_job']:.0f} us/job, "
                    f"server CPU {r['server_cpu_us_per_job']:.0f} us/job"
                )
        label = f"{jobs:,} jobs, concurrency {concurrency}"
        out.rows += _rows(label, "sync", s) + _rows(label, "async", s)
        raw: dict[str, Any] = {h: {f: v.as_dict() for f, v in s[h].items()} for h in HANDLERS}
        out.raw[f"c{concurrency}"] = raw
    return out
