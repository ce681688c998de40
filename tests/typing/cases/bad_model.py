"""A handler whose payload type is not its kind's model."""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs

jobs = Jobs()


class Invoice(BaseModel):
    invoice_id: int


class Image(BaseModel):
    path: str


# mypy names the first overload's shape as the one expected, whichever shape the handler has;
# the handler's own type, in the message, shows the model that does not fit.
@jobs.kind("sync", Invoice)  # E: "__call__" of "KindDecorator" has incompatible type
def sync(payload: Image, ctx: JobContext) -> None:
    pass


@jobs.kind("async", Invoice)  # E: "Callable[[Image, JobContext], Coroutine[Any, Any, None]]"
async def async_(payload: Image, ctx: JobContext) -> None:
    pass


@jobs.kind("session", Invoice)  # E: "Callable[[Image, JobContext, Session], None]"
def session(payload: Image, ctx: JobContext, session: Session) -> None:
    pass


@jobs.kind("async_session", Invoice)  # E: "__call__" of "KindDecorator" has incompatible type
async def async_session(payload: Image, ctx: JobContext, session: AsyncSession) -> None:
    pass


def resize(payload: Image, ctx: JobContext) -> None:
    pass


def resize_in(payload: Image, ctx: JobContext, session: Session) -> None:
    pass


jobs.register("resize", Invoice, resize)  # E: Argument 3 to "register" of "Registry"
jobs.register("resize_in", Invoice, resize_in)  # E: Argument 3 to "register" of "Registry"
# A lambda takes its parameter types from the kind's model.
jobs.register("note", Invoice, lambda payload, ctx: payload.path)  # E: "Invoice" has no attribute
jobs.kind("note2", Image)(lambda payload, ctx: payload.invoice_id)  # E: "Image" has no attribute
