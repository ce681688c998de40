"""Kind options: a misspelled name, a value of the wrong type, a key function of another model."""

from __future__ import annotations

from pydantic import BaseModel

from sqla_jobs import JobContext, Jobs

jobs = Jobs()


class Order(BaseModel):
    order_id: int
    customer: str


@jobs.kind("order", Order, max_attempt=3)  # E: Unexpected keyword argument "max_attempt"
def order(payload: Order, ctx: JobContext) -> None:
    pass


jobs.register("a", Order, queu="mail")  # E: Unexpected keyword argument "queu"
jobs.register("b", Order, priority="high")  # E: Argument "priority" to "register"
jobs.register("c", Order, timeout="30s")  # E: Argument "timeout" to "register"
jobs.register("d", Order, unique=("order_id",))  # E: Argument "unique" to "register"
jobs.register("e", Order, concurrency_limit=None, backoff=2)  # E: Argument "backoff" to "register"
jobs.register("f", Order, concurrency_key=lambda p: p.tenant)  # E: has no attribute "tenant"


def int_key(payload: Order) -> int:
    return payload.order_id


class Other(BaseModel):
    tenant: str


def other_key(payload: Other) -> str:
    return payload.tenant


jobs.register("h", Order, concurrency_key=other_key)  # E: Argument "concurrency_key" to "register"
jobs.register("i", Order, concurrency_key=int_key)  # E: Argument "concurrency_key" to "register"
