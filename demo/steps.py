"""Steps 2 to 5: migrate, a business row and its jobs in one transaction, a worker, the outcomes."""

from __future__ import annotations

import io
import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import Any

from alembic import command
from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session
from sqlalchemy.schema import CreateSchema

from sqla_jobs.migrate import alembic_config, upgrade
from sqla_jobs.model import JOB_TABLE, Job, JobHistory
from sqla_jobs.observe.stats import collect, render

from .console import short_error
from .invoices import DemoBase, Invoice, SendInvoice, payloads
from .threads import Sampler, wait_for
from .tour import CLAIMS_WAITING, HEARTBEAT, LEASE, OTHER_WAITS, POLL, SLOTS, Demo


def migrate(demo: Demo) -> None:
    """Step 2: the shipped migrations, and what they created."""
    c = demo.console
    c.step(2, "Migrate: one table and its partial indexes")
    c.explain(
        "sqla_jobs.migrate.upgrade(url) runs the Alembic revisions shipped in the package "
        "(branch 'sqla_jobs'); an application that has its own Alembic setup includes them "
        "instead."
    )
    if demo.schema is not None:
        with demo.app.begin() as conn:
            conn.execute(CreateSchema(demo.schema))
        c.say(f"created schema {demo.schema} for the queue: Jobs(schema={demo.schema!r})")
    upgrade(demo.url, schema=demo.schema)
    # `alembic current` through the package's own environment, which knows its version table.
    config, printed = alembic_config(demo.url, demo.schema), io.StringIO()
    config.stdout = printed
    command.current(config)
    version = printed.getvalue().strip()
    with demo.app.connect() as conn:
        found = inspect(conn)
        columns = [col["name"] for col in found.get_columns(JOB_TABLE, schema=demo.schema)]
        indexes = found.get_indexes(JOB_TABLE, schema=demo.schema)
    c.say(f"migrated to: {version}")
    c.say(textwrap.fill(f"table {JOB_TABLE}: {', '.join(columns)}", 96, subsequent_indent="  "))
    for index in sorted(indexes, key=lambda i: str(i["name"])):
        keys = [
            name or expression
            for name, expression in zip(
                index["column_names"],
                index.get("expressions", index["column_names"]),
                strict=False,
            )
        ]
        where = index.get("dialect_options", {}).get("postgresql_where")
        c.say(
            f"index {index['name']} ({', '.join(str(k) for k in keys)})"
            + (f" WHERE {where}" if where is not None else "")
        )
    c.explain(
        "state, run_at, attempts, the lease columns and last_error are the whole state machine. "
        "run_at is both the delay and the retry schedule; the claim index holds only pending "
        "rows, so it stays the size of the backlog, not of history."
    )


def enqueue(demo: Demo) -> None:
    """Step 3: a business row and its jobs in one transaction; a rollback leaves neither."""
    c = demo.console
    c.step(3, "A business row and its jobs, in ONE transaction")
    DemoBase.metadata.create_all(demo.app)
    c.explain(
        "The demo application has its own ORM table, demo_invoice. In one "
        "`with Session(engine) as s, s.begin():` it adds an invoice and enqueues 20 jobs with "
        "jobs.enqueue_many(s, [...]), one INSERT. Nothing is committed until the block ends."
    )
    all_jobs = select(func.count()).select_from(Job)
    with Session(demo.app) as s, s.begin():
        invoice = Invoice(customer="ACME Corp", amount_cents=129_900)
        s.add(invoice)
        s.flush()
        demo.invoice_id = invoice.id
        ids = demo.jobs.enqueue_many(s, payloads(invoice.id))
        outside = demo.value(all_jobs)
        c.say(
            f"inside the transaction: invoice #{invoice.id} and jobs {ids[0]}..{ids[-1]} exist; "
            f"another connection sees {outside} jobs"
        )
    jobs = func.count().label("jobs")
    kinds = demo.rows(select(Job.kind, jobs).group_by(Job.kind).order_by(jobs.desc(), Job.kind))
    c.say(
        f"committed: another connection now sees {sum(n for _, n in kinds)} pending jobs: "
        + ", ".join(f"{n} {k}" for k, n in kinds)
    )
    c.say("kinds: send_invoice (ok, 100-180 ms), flaky_webhook (503 for the first 1-2 calls,")
    c.say("       Backoff(base=1.5, cap_seconds=3)), broken_report (always raises, max_attempts=2)")

    with Session(demo.app) as s:
        tx = s.begin()
        other = Invoice(customer="Globex", amount_cents=4_200)
        s.add(other)
        s.flush()
        job = demo.jobs.enqueue(s, SendInvoice(invoice_id=other.id, to="ap@globex.example"))
        job_id, other_id = job.id, other.id
        tx.rollback()
    left_jobs = demo.value(all_jobs.where(Job.id == job_id))
    with demo.app.connect() as conn:
        left_invoices = conn.execute(
            select(func.count()).select_from(Invoice).where(Invoice.id == other_id)
        ).scalar()
    c.say(
        f"rolled back: a second transaction added invoice #{other_id} and job {job_id}, then "
        f"rolled back -> {left_invoices} invoice, {left_jobs} job left"
    )
    c.explain(
        "The job exists if and only if the business row does: no dual write, no outbox. The "
        "wake-up NOTIFY is sent just after the commit, by the library's notifier on a "
        "connection of its own: a rolled-back job wakes no one, and the commit never waits "
        "for it."
    )
    c.say()
    c.say(render(collect(demo.url, schema=demo.schema)))


def work(demo: Demo) -> None:
    """Step 4: one worker drains the 20 jobs; a sampler watches for lock waits."""
    c = demo.console
    c.step(4, f"A worker with {SLOTS} slots: claims without waiting")
    c.explain(
        f"Worker(jobs, url, concurrency={SLOTS}, poll_interval={POLL}, lease={LEASE:g}, "
        f"heartbeat={HEARTBEAT:g}, keep_history=True) runs in a background thread. Its fetch "
        f"loop claims up to {SLOTS} jobs in ONE statement (UPDATE ... FROM a MATERIALIZED "
        "SELECT ... FOR UPDATE SKIP LOCKED) and runs them as asyncio tasks. Finished jobs are "
        "deleted (kept in sqla_jobs_history here, so we can look). A sampler watches "
        "pg_stat_activity for claims waiting on a row lock, which SKIP LOCKED spares them."
    )
    peak = {"running": 0}

    def on_sample(row: Sequence[Any]) -> None:
        waiting, running = int(row[0]), int(row[2])
        if running >= SLOTS > peak["running"]:
            c.event(f"db: {running} jobs running at once, {waiting} claims waiting on a row lock")
        peak["running"] = max(peak["running"], running)

    running_jobs = (
        select(func.count()).select_from(Job).where(Job.state == "running").scalar_subquery()
    )
    sampler = Sampler(
        demo.queue, select(CLAIMS_WAITING, OTHER_WAITS, running_jobs), 0.02, on_sample
    )
    demo.samplers.append(sampler)
    c.say()
    c.restart_clock()
    sampler.start()
    worker = demo.worker("worker-A")
    c.event(f"worker-A started ({SLOTS} slots, LISTENing for NOTIFY, polling every {POLL}s)")
    unfinished = select(func.count()).select_from(Job).where(Job.state.in_(("pending", "running")))
    wait_for("the 20 jobs to finish", lambda: demo.value(unfinished) == 0)
    sampler.stop()
    demo.stop(worker)
    counts = worker.worker.counts
    c.event(
        f"worker-A stopped gracefully: claimed {counts['claimed']}, done {counts['done']}, "
        f"failed {counts['failed']}, dead {counts['dead']}"
    )
    waits = [int(r[0]) for r in sampler.rows]
    others = Counter(w for r in sampler.rows if r[1] for w in str(r[1]).split("; "))
    c.say()
    c.say(
        f"sampled every 20 ms ({len(waits)} samples): at most {peak['running']} jobs running at "
        f"once; samples with a claim waiting on a row lock: {sum(1 for w in waits if w)}"
    )
    if others:
        seen = "; ".join(f"{wait} ({n} samples)" for wait, n in sorted(others.items()))
        c.explain(
            f"(Other lock waits: {seen}. Not claims: an outcome write can wait a moment for the "
            "worker's own heartbeat, which holds a running job's row while it renews the lease; "
            "'extend' is a table growing.)"
        )
    if peak["running"] > SLOTS:
        c.explain(
            f"(More than {SLOTS}: a slot takes its next job as soon as its handler returns, "
            "while the finished job's row stays 'running' until the fetch loop writes the "
            "outcome, a few milliseconds later.)"
        )


def outcomes(demo: Demo) -> None:
    """Step 5: what the tables hold after the retries and the dead job."""
    c = demo.console
    c.step(5, "Retries with backoff, and a dead job")
    c.explain(
        "Above, each failure went through ONE fail statement: the database itself chose "
        "between 'pending again, run_at = now() + least(base ^ failures, cap)' and 'dead', "
        "from the row's own counters (flaky_webhook: 1.5 s, then 2.25 s). Attempts are "
        "counted at claim time. What the tables hold now:"
    )
    left = demo.rows(
        select(
            Job.kind, Job.state, func.count(), func.sum(Job.attempts), func.max(Job.last_error)
        ).group_by(Job.kind, Job.state)
    )
    done = demo.rows(
        select(JobHistory.kind, func.count(), func.sum(JobHistory.attempts)).group_by(
            JobHistory.kind
        )
    )
    rows = sorted(
        [(kind, "done", jobs, attempts, None) for kind, jobs, attempts in done] + left,
        key=lambda r: (r[0], r[1]),
    )
    c.say(f"{'kind':<15} {'outcome':<8} {'jobs':>4} {'attempts':>9}  last_error")
    for kind, outcome, jobs, attempts, error in rows:
        line = f"{kind:<15} {outcome:<8} {jobs:>4} {attempts:>9}  {short_error(error or '')}"
        c.say(line.rstrip())
    c.explain(
        "Every job ended as designed: send_invoice done on attempt 1, flaky_webhook done after "
        "its outages, broken_report dead after max_attempts=2 with its last_error kept for a "
        "human (pending again only if someone resets it)."
    )
