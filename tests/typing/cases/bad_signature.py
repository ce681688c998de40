"""Handlers of a shape the worker cannot call."""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs

jobs = Jobs()


class A(BaseModel):
    pass


class B(BaseModel):
    pass


class C(BaseModel):
    pass


class D(BaseModel):
    pass


class E(BaseModel):
    pass


class F(BaseModel):
    pass


class G(BaseModel):
    pass


class H(BaseModel):
    pass


@jobs.kind("no_ctx", A)  # E: "__call__" of "KindDecorator" has incompatible type
def no_ctx(payload: A) -> None:
    pass


@jobs.kind("four", B)  # E: "__call__" of "KindDecorator" has incompatible type
def four(payload: B, ctx: JobContext, session: Session, extra: int) -> None:
    pass


@jobs.kind("keyword_only", C)  # E: "__call__" of "KindDecorator" has incompatible type
def keyword_only(payload: C, ctx: JobContext, *, dry_run: bool) -> None:
    pass


# A sync handler is given a Session: an AsyncSession parameter would get the wrong one.
@jobs.kind("sync_async_session", D)  # E: "__call__" of "KindDecorator" has incompatible type
def sync_async_session(payload: D, ctx: JobContext, session: AsyncSession) -> None:
    pass


# An async handler is given an AsyncSession: its un-awaited session.execute() would never run.
@jobs.kind("async_session", E)  # E: "__call__" of "KindDecorator" has incompatible type
async def async_session(payload: E, ctx: JobContext, session: Session) -> None:
    pass


# The context is the second argument, not the first.
@jobs.kind("swapped", F)  # E: "__call__" of "KindDecorator" has incompatible type
def swapped(ctx: JobContext, payload: F) -> None:
    pass


# A sync handler that takes a Session returns None or a JSON-like result (stored with results=True;
# which is also what keeps an `async def` taking a Session out): a set is neither.
@jobs.kind("returns", H)  # E: "__call__" of "KindDecorator" has incompatible type
def returns(payload: H, ctx: JobContext, session: Session) -> set[int]:
    return {1}


def one(payload: G) -> None:
    pass


jobs.register("one", G, one)  # E: Argument 3 to "register" of "Registry" has incompatible type
