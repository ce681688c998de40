"""Sync handlers of the kind's model, and every option with a value of its type."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from pydantic import BaseModel
from typing_extensions import assert_type

from sqla_jobs import Backoff, JobContext, Jobs, Unique
from sqla_jobs.kinds import Registry

jobs = Jobs()


class SendInvoice(BaseModel):
    invoice_id: int
    customer: str


@jobs.kind(
    "send_invoice",
    SendInvoice,
    queue="billing",
    priority=-5,
    max_attempts=3,
    max_crashes=2,
    backoff=Backoff(base=2, jitter=0),
    timeout=30,
    concurrency_key=lambda p: p.customer,
    concurrency_limit=2,
    unique=Unique(by=("invoice_id",), period=timedelta(hours=1)),
)
def send_invoice(payload: SendInvoice, ctx: JobContext) -> int:
    return payload.invoice_id + ctx.job_id


# The decorated name keeps the handler's payload and result types: tests call it directly.
assert_type(send_invoice, Callable[[SendInvoice, JobContext], int])


def resend(ctx: JobContext) -> int:
    return send_invoice(SendInvoice(invoice_id=1, customer="c"), ctx)


class Refund(BaseModel):
    invoice_id: int


def customer_key(payload: Refund) -> str:
    return str(payload.invoice_id)


# A handler may take a wider payload type (any model) and a wider context; unique=True is the
# whole payload.
@jobs.kind("refund", Refund, unique=True, concurrency_key=customer_key, timeout=None)
def refund(payload: BaseModel, ctx: object) -> None:
    pass


class Audit(BaseModel):
    entry: str


# The plain Registry has the same signatures.
registry = Registry()
registry.kind("audit", Audit, max_attempts=1)(lambda payload, ctx: print(payload.entry, ctx.job_id))
