"""The application of the link tests: orders whose jobs are linked through a link table, and the
foreign keys to the job table an application writes by hand: an invoice's, with the default
action (NO ACTION, which refuses the deletion of its job), a voucher's (RESTRICT, which refuses it
too), a ticket's (NO ACTION checked at commit), and a receipt's, ON DELETE SET NULL.

Its tables are created and dropped by each test that uses them (:func:`app_tables`): a foreign key
to the job table would stop the ``clean`` fixture's TRUNCATE of it in every later test.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel
from sqlalchemy import BigInteger, Engine, ForeignKey, MetaData, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from sqla_jobs import Backoff, Job, JobContext, Jobs, link_table


class Base(DeclarativeBase):
    # The application's own MetaData and naming convention, not the package's.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Order(Base):
    __tablename__ = "links_order"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(Text, default="acme")
    jobs: Mapped[list[Job]] = relationship(
        Job, secondary=lambda: order_jobs, viewonly=True, order_by=Job.id
    )


#: (a) A link table: both foreign keys ON DELETE CASCADE.
order_jobs = link_table("links_order_jobs", Base.metadata, Order.id, column="order_id")


class Invoice(Base):
    """(b) A foreign key to a job with the default action: the job's row cannot be deleted."""

    __tablename__ = "links_invoice"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, ForeignKey(Job.id))


class Voucher(Base):
    """(b) The same, with ON DELETE RESTRICT (checked at once rather than at the statement's end)."""

    __tablename__ = "links_voucher"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, ForeignKey(Job.id, ondelete="RESTRICT"))


class Ticket(Base):
    """(b) The same, DEFERRABLE INITIALLY DEFERRED (checked at commit), as Django makes them."""

    __tablename__ = "links_ticket"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(Job.id, deferrable=True, initially="DEFERRED")
    )


class Receipt(Base):
    """(c) A foreign key to a job ON DELETE SET NULL: the job's deletion clears it."""

    __tablename__ = "links_receipt"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey(Job.id, ondelete="SET NULL"))


QUEUE = "links"
jobs = Jobs()


class Note(BaseModel):
    order_id: int


class Boom(BaseModel):
    order_id: int


class Flaky(BaseModel):
    order_id: int


@jobs.kind("links_note", Note, queue=QUEUE)
def note(args: Note, ctx: JobContext) -> None:
    """Succeeds."""


@jobs.kind("links_boom", Boom, queue=QUEUE, max_attempts=1)
def boom(args: Boom, ctx: JobContext) -> None:
    """Fails on its only attempt: dead at once."""
    raise RuntimeError("boom on purpose")


@jobs.kind("links_flaky", Flaky, queue=QUEUE, backoff=Backoff(cap_seconds=0))
def flaky(args: Flaky, ctx: JobContext) -> None:
    """Fails its first attempt, retried at once, and succeeds on the second."""
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails on purpose")


@contextmanager
def app_tables(engine: Engine) -> Iterator[None]:
    """The application's tables, created for the block and dropped after it."""
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    try:
        yield
    finally:
        Base.metadata.drop_all(engine)
