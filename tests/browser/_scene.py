"""What the browser tests (and the screenshots of docs/) show: queues with jobs in every state,
dead jobs with a real-looking error record, a running job, a paused queue, a live worker, and an
hour of throughput. Written as a superuser into the roles' schema, as workers would have."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from sqla_jobs import Jobs


class SendInvoice(BaseModel):
    invoice_id: int


class BuildReport(BaseModel):
    report: str


class DeliverWebhook(BaseModel):
    url: str


def make_jobs(schema: str) -> Jobs:
    jobs = Jobs(schema=schema)
    jobs.register("send_invoice", SendInvoice, queue="mail")
    jobs.register("build_report", BuildReport, queue="reports")
    jobs.register("deliver_webhook", DeliverWebhook, queue="webhooks")
    return jobs


TRACEBACK = """Traceback (most recent call last):
  File "/srv/shop/shop/tasks.py", line 31, in send_invoice
    smtp.send_message(message)
  File "/usr/lib/python3.12/smtplib.py", line 986, in send_message
    return self.sendmail(from_addr, to_addrs, flatmsg, mail_options, rcpt_options)
smtplib.SMTPServerDisconnected: Connection unexpectedly closed"""


@dataclass(frozen=True)
class Scene:
    dead: list[int]
    running: list[int]
    pending: list[int]


def build(engine: Engine, jobs: Jobs) -> Scene:
    """Fill the roles' schema with the scene; returns the ids the tests act on."""
    schema = jobs.schema
    with Session(engine) as session, session.begin():
        invoices = jobs.enqueue_many(
            session, [SendInvoice(invoice_id=1000 + i) for i in range(14)], meta={"tenant": "acme"}
        )
        reports = jobs.enqueue_many(session, [BuildReport(report=f"daily-{i}") for i in range(5)])
        hooks = jobs.enqueue_many(session, [DeliverWebhook(url="https://example.com/h")] * 3)
    dead, running = invoices[:3], [invoices[3], invoices[4], reports[0]]
    error = [
        {
            "attempt": a,
            "at": f"2026-12-01T07:0{a}:23.391277+00:00",
            "error": "SMTPServerDisconnected",
            "message": "Connection unexpectedly closed",
            "traceback": TRACEBACK,
        }
        for a in (1, 2, 3)
    ]
    with engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE {schema}.sqla_jobs_job SET state = 'dead', attempts = 3, max_attempts = 3,"
                " last_error = 'SMTPServerDisconnected: Connection unexpectedly closed',"
                " errors = CAST(:errors AS jsonb), finished_at = now(),"
                " steps = '{\"rendered_pdf\": true}' WHERE id = ANY(:ids)"
            ),
            {"ids": dead, "errors": json.dumps(error)},
        )
        conn.execute(
            text(
                f"UPDATE {schema}.sqla_jobs_job SET state = 'running', attempts = 1,"
                " lease_token = gen_random_uuid(), locked_by = 'web-1:4242:9f1c2a',"
                " lease_expires_at = now() + interval '1 hour' WHERE id = ANY(:ids)"
            ),
            {"ids": running},
        )
        conn.execute(
            text(
                f"UPDATE {schema}.sqla_jobs_job SET run_at = now() - interval '42 seconds'"
                " WHERE state = 'pending'"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO {schema}.sqla_jobs_queue (queue, paused_at) VALUES ('webhooks', now())"
                " ON CONFLICT (queue) DO UPDATE SET paused_at = now()"
            )
        )
        conn.execute(
            text(
                f"INSERT INTO {schema}.sqla_jobs_worker (name, host, pid, queues, concurrency,"
                " expires_at) VALUES ('web-1:4242:9f1c2a', 'web-1', 4242, '{mail,reports}', 8,"
                " now() + interval '1 hour') ON CONFLICT (name) DO NOTHING"
            )
        )
        _throughput(conn, schema)
    pending = [i for i in [*invoices, *reports, *hooks] if i not in dead and i not in running]
    return Scene(dead=dead, running=running, pending=pending)


def _throughput(conn: object, schema: str | None) -> None:
    """An hour of per-minute counts: a steady mail queue, hourly-ish report bursts, a few
    failures and one dead job; deterministic, so the screenshot is the same every run."""
    rows = []
    for ago in range(60):
        wave = (ago * 7) % 11
        rows.append(("mail", "send_invoice", ago, 30 + wave, 1 if ago % 9 == 0 else 0,
                     1 if ago == 17 else 0, 0.35 + wave / 40, 0.8 + (ago % 5) / 10))  # fmt: skip
        if ago % 6 < 2:
            rows.append(("reports", "build_report", ago, 6 + ago % 4, 1 if ago % 12 == 0 else 0,
                         0, 4.0 + ago % 3, 2.5))  # fmt: skip
    for queue, kind, ago, completed, failed, dead, run, pickup in rows:
        runs = completed + failed + dead
        conn.execute(  # type: ignore[attr-defined]
            text(
                f"INSERT INTO {schema}.sqla_jobs_throughput (minute, queue, kind, completed,"
                " failed, dead, runs, run_seconds, pickups, pickup_seconds) VALUES"
                " (date_trunc('minute', now()) - :ago * interval '1 minute', :queue, :kind,"
                " :completed, :failed, :dead, :runs, :run_s, :runs, :pickup_s)"
                " ON CONFLICT DO NOTHING"
            ),
            {
                "ago": ago,
                "queue": queue,
                "kind": kind,
                "completed": completed,
                "failed": failed,
                "dead": dead,
                "runs": runs,
                "run_s": run * runs,
                "pickup_s": pickup * runs,
            },
        )
