"""The rate limiters: one row per rate limited kind, or per kind and key of a ``RateLimit(by=)``,
holding the times of its latest starts. Only the rate limited claim writes it, and the pruner
deletes the rows of keys gone idle."""

from datetime import datetime, timedelta

from sqlalchemy import DateTime, Integer, Interval, Text, func, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from sqla_jobs.model.names import RATE_LIMITER_TABLE, Base


class RateLimiter(Base):
    """One rate limiter: the latest starts of the jobs whose ``rate_key`` is ``rate_key``.

    A claim takes the row ``FOR UPDATE SKIP LOCKED`` in its own transaction (claims of one key are
    serialized, other keys go on), admits a start iff fewer than ``allowed`` of ``starts`` fall in
    the last ``per``, and appends its starts. ``starts`` keeps the ``allowed`` latest, ascending:
    enough to decide, whatever happened before them. A row past ``free_at`` limits nothing and is
    deleted by the pruner; the next claim of its key makes it again.
    """

    __tablename__ = RATE_LIMITER_TABLE

    #: The job's ``rate_key``: its kind, and the ``by=`` key after a space if any.
    rate_key: Mapped[str] = mapped_column(Text, primary_key=True)
    #: Claim times (the claiming transaction's ``now()``), ascending, at most ``allowed`` of them.
    starts: Mapped[list[datetime]] = mapped_column(
        ARRAY(DateTime(timezone=True)), server_default=text("'{}'")
    )
    #: The limit the last claim applied: starts allowed per ``per`` (for listings).
    allowed: Mapped[int | None] = mapped_column(Integer)
    per: Mapped[timedelta | None] = mapped_column(Interval)
    #: The newest start plus ``per``: from then on the row limits nothing (the pruner's test).
    free_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
