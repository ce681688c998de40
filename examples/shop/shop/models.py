"""The shop's tables, on its own MetaData: ``orders``, and ``order_jobs``, which links an order to
its jobs (``sqla_jobs.link_table``: a foreign key each way, both ``ON DELETE CASCADE``)."""

from __future__ import annotations

from datetime import datetime

import sqla_jobs
from sqla_jobs import Job
from sqlalchemy import BigInteger, DateTime, Identity, MetaData, Table, Text, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

#: SQLAlchemy's documented convention: every constraint and index gets a predictable name, which
#: autogenerate then writes out in full (op.f(...)) in each revision.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    customer: Mapped[str] = mapped_column(Text)
    item: Mapped[str] = mapped_column(Text)
    quantity: Mapped[int]
    status: Mapped[str] = mapped_column(Text, server_default="placed")
    # Times come from the database's clock, never from the web server's or the worker's.
    placed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    shipped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    #: This order's jobs that are still in the queue (pending, running, or dead), oldest first.
    #: A job that completes is deleted, and its link with it. Read-only: enqueue writes the links.
    jobs: Mapped[list[Job]] = relationship(
        Job, secondary=lambda: order_jobs, viewonly=True, order_by=Job.id
    )


# Annotated because mypy cannot infer it through the lambda above, which names it before it exists.
order_jobs: Table = sqla_jobs.link_table("order_jobs", Base.metadata, Order.id, column="order_id")
