"""The shop's job kinds and their handlers, run by
``sqla-jobs worker shop.tasks:jobs --sessionmaker shop.db:SessionLocal``."""

from __future__ import annotations

from pydantic import BaseModel
from sqla_jobs import JobContext, Jobs
from sqlalchemy import func, update
from sqlalchemy.orm import Session

from shop.models import Order

jobs = Jobs()


class ShipOrder(BaseModel):
    order_id: int


@jobs.kind("ship_order", ShipOrder, queue="shipping", max_attempts=5)
def ship_order(payload: ShipOrder, ctx: JobContext, session: Session) -> None:
    """Mark the order shipped. The worker commits this write in one transaction with the job's
    completion: if the handler raises, or the worker dies before the commit, neither happens and
    the job runs again, so the order is marked shipped exactly once."""
    session.execute(
        update(Order)
        .where(Order.id == payload.order_id, Order.status != "shipped")
        .values(status="shipped", shipped_at=func.now())
    )
