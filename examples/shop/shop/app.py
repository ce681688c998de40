"""The shop's HTTP API. Run it with ``uvicorn shop.app:app``.

``POST /orders`` writes the order and enqueues its ``ship_order`` job in one transaction: both
commit, or neither does. ``GET /orders/{id}`` shows the order and its jobs still in the queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqla_jobs import Job
from sqlalchemy import select
from sqlalchemy.orm import Session

from shop import db
from shop.models import Order, order_jobs
from shop.tasks import ShipOrder, jobs

app = FastAPI(title="shop")


def get_session() -> Iterator[Session]:
    """One Session per request (tests override this dependency)."""
    with db.SessionLocal() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


class NewOrder(BaseModel):
    customer: str = Field(min_length=1)
    item: str = Field(min_length=1)
    quantity: int = Field(gt=0)


class JobOut(BaseModel):
    id: int
    kind: str
    queue: str
    state: str
    attempts: int
    run_at: datetime
    last_error: str | None


class OrderOut(BaseModel):
    id: int
    customer: str
    item: str
    quantity: int
    status: str
    placed_at: datetime
    shipped_at: datetime | None
    jobs: list[JobOut]


@app.post("/orders", status_code=201)
def place_order(new: NewOrder, session: SessionDep) -> OrderOut:
    """Create the order and enqueue its shipping in the same transaction. Workers are woken at
    the commit, and only if it succeeds: a job never runs for an order that was rolled back."""
    with session.begin():
        order = Order(customer=new.customer, item=new.item, quantity=new.quantity)
        session.add(order)
        session.flush()  # the order's id, for the payload and the link
        jobs.enqueue(session, ShipOrder(order_id=order.id), link={order_jobs: order.id})
    return show_order(order.id, session)


@app.get("/orders/{order_id}")
def show_order(order_id: int, session: SessionDep) -> OrderOut:
    """The order, and its jobs still in the queue (a completed job is deleted, with its link)."""
    order = session.get(Order, order_id)
    if order is None:
        raise HTTPException(status_code=404, detail=f"order {order_id} not found")
    # The same as order.jobs, written out: the join follows order_jobs' foreign key to the job.
    queued = session.scalars(
        select(Job).join(order_jobs).where(order_jobs.c.order_id == order_id).order_by(Job.id)
    )
    return OrderOut(
        id=order.id,
        customer=order.customer,
        item=order.item,
        quantity=order.quantity,
        status=order.status,
        placed_at=order.placed_at,
        shipped_at=order.shipped_at,
        jobs=[JobOut.model_validate(job, from_attributes=True) for job in queued],
    )
