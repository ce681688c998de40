"""Handlers that take the Session (sync) or the AsyncSession (async) their job completes in."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from typing_extensions import assert_type

from sqla_jobs import JobContext, Jobs

jobs = Jobs()


class Ship(BaseModel):
    order_id: int


@jobs.kind("ship", Ship, max_attempts=5)
def ship(payload: Ship, ctx: JobContext, session: Session) -> None:
    session.execute(text("SELECT 1"))


assert_type(ship, Callable[[Ship, JobContext, Session], None])


class Bill(BaseModel):
    order_id: int


@jobs.kind("bill", Bill, queue="billing")
async def bill(payload: Bill, ctx: JobContext, session: AsyncSession) -> None:
    await session.execute(text("SELECT 1"))


assert_type(bill, Callable[[Bill, JobContext, AsyncSession], Coroutine[Any, Any, None]])


class Pack(BaseModel):
    order_id: int


def pack(payload: Pack, ctx: JobContext, session: Session) -> None:
    pass


class Label(BaseModel):
    order_id: int


async def label(payload: Label, ctx: JobContext, session: AsyncSession) -> None:
    pass


jobs.register("pack", Pack, pack, priority=1)
jobs.register("label", Label, label)


class Tally(BaseModel):
    order_id: int


# A sync handler that takes a Session may return the result a kind with results=True stores.
@jobs.kind("tally", Tally, results=True)
def tally(payload: Tally, ctx: JobContext, session: Session) -> dict[str, int]:
    return {"order_id": payload.order_id}


assert_type(tally, Callable[[Tally, JobContext, Session], dict[str, int]])
