"""The application the story runs: an invoice table of its own, four job kinds and their handlers.

Its table lives on its own declarative base and MetaData, never the package's, as an application's
would. The handlers print what they do, so the story shows each run as it happens; two of them wait
on events the rescue step sets, to freeze a worker mid-job and to hold the rescuer's run until the
frozen worker's late write has been shown to be fenced out.
"""

from __future__ import annotations

import asyncio
import threading

from pydantic import BaseModel
from sqlalchemy import BigInteger, MetaData, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_jobs import JobContext, Jobs
from sqla_jobs.backoff import Backoff

from .console import Console

#: Upper bound on any single wait of the demo; the whole story normally takes 15-25 s.
DEADLINE = 30.0
#: The worker of the rescue step that freezes in the middle of its job.
FROZEN_WORKER = "worker-B"


class DemoBase(DeclarativeBase):
    """The demo application's own declarative base, on its own MetaData (never the package's)."""

    metadata = MetaData()


class Invoice(DemoBase):
    """A business row: the jobs about it are enqueued in the transaction that creates it."""

    __tablename__ = "demo_invoice"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer: Mapped[str] = mapped_column(Text)
    amount_cents: Mapped[int] = mapped_column(BigInteger)


class SendInvoice(BaseModel):
    """Email the invoice to one billing contact."""

    invoice_id: int
    to: str


class FlakyWebhook(BaseModel):
    """Tell a partner system; its endpoint answers 503 for the first ``outages`` calls."""

    invoice_id: int
    url: str
    outages: int


class BrokenReport(BaseModel):
    """Render a report from a template that does not exist: it can never succeed."""

    invoice_id: int
    template: str


class NightlyExport(BaseModel):
    """Export the invoice to the warehouse (an idempotent upsert)."""

    invoice_id: int


def payloads(invoice_id: int) -> list[BaseModel]:
    """The 20 jobs of one invoice: 16 emails, 3 webhooks that fail at first, 1 broken report."""
    send = [
        SendInvoice(invoice_id=invoice_id, to=f"billing+{i}@acme.example") for i in range(1, 17)
    ]
    hooks = [
        FlakyWebhook(invoice_id=invoice_id, url="https://erp.acme.example/hooks", outages=1),
        FlakyWebhook(invoice_id=invoice_id, url="https://crm.acme.example/hooks", outages=2),
        FlakyWebhook(invoice_id=invoice_id, url="https://ledger.acme.example/hooks", outages=1),
    ]
    report = BrokenReport(invoice_id=invoice_id, template="q3-summary.xlsx")
    # Interleaved, so the first claims already mix kinds.
    return [
        *send[:3],
        hooks[0],
        *send[3:6],
        report,
        *send[6:9],
        hooks[1],
        *send[9:12],
        hooks[2],
        *send[12:],
    ]


class Handlers:
    """The handlers of the four kinds, printing to the story's console."""

    def __init__(self, console: Console) -> None:
        self.console = console
        #: Set to let the frozen worker's export return (late: its lease is gone by then).
        self.frozen_may_wake = threading.Event()
        #: Set to let the rescuer's export finish, once the frozen worker's write was refused.
        self.rescue_may_finish = threading.Event()

    def release(self) -> None:
        """Let every waiting handler return (at the end, or on an error)."""
        self.frozen_may_wake.set()
        self.rescue_may_finish.set()

    def register(self, jobs: Jobs) -> None:
        """Register the four kinds on ``jobs``, with the retry policies the story shows."""
        jobs.register("send_invoice", SendInvoice, self.send_invoice)
        jobs.register(
            "flaky_webhook",
            FlakyWebhook,
            self.flaky_webhook,
            max_attempts=5,
            backoff=Backoff(base=1.5, cap_seconds=3),
        )
        jobs.register(
            "broken_report",
            BrokenReport,
            self.broken_report,
            max_attempts=2,
            backoff=Backoff(base=1, cap_seconds=0.5),
        )
        jobs.register("nightly_export", NightlyExport, self.nightly_export, max_crashes=3)

    async def send_invoice(self, p: SendInvoice, ctx: JobContext) -> None:
        await asyncio.sleep(0.10 + 0.02 * (ctx.job_id % 5))
        self.console.event(
            f"{ctx.worker}: job {ctx.job_id} emailed invoice #{p.invoice_id} to {p.to}"
        )

    async def flaky_webhook(self, p: FlakyWebhook, ctx: JobContext) -> None:
        await asyncio.sleep(0.05)
        if ctx.attempt <= p.outages:
            raise RuntimeError(f"POST {p.url} -> 503 Service Unavailable")
        self.console.event(
            f"{ctx.worker}: job {ctx.job_id} POST {p.url} -> 200 OK on attempt {ctx.attempt}"
        )

    async def broken_report(self, p: BrokenReport, ctx: JobContext) -> None:
        await asyncio.sleep(0.05)
        raise FileNotFoundError(f"report template {p.template!r} does not exist")

    def nightly_export(self, p: NightlyExport, ctx: JobContext) -> None:
        # A sync handler: the worker runs it in its thread pool, so it may block.
        if ctx.worker == FROZEN_WORKER:
            self.console.event(
                f"{ctx.worker}: job {ctx.job_id} export of invoice #{p.invoice_id} started ... "
                "and the worker freezes"
            )
            self.frozen_may_wake.wait(DEADLINE)
            self.console.event(
                f"{ctx.worker}: woke up; job {ctx.job_id} finished, reporting it done (too late)"
            )
            return
        self.console.event(
            f"{ctx.worker}: job {ctx.job_id} attempt {ctx.attempt} (crashes={ctx.crashes}): "
            "a rerun after a crash; the export is an upsert, so running it twice is safe"
        )
        self.rescue_may_finish.wait(DEADLINE)
        self.console.event(f"{ctx.worker}: job {ctx.job_id} exported invoice #{p.invoice_id}")
