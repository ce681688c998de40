"""The columns enqueue writes to a job row: the one list of them, in order, with how each is bound
and written by COPY. Every statement that names them (the INSERTs and COPY's column list) and the
rows enqueue builds (:mod:`sqla_jobs.enqueue.row`) derive from :data:`COLUMNS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import BigInteger, Text
from sqlalchemy.types import TypeEngine

__all__ = ["COLUMNS", "NAMES", "OPTIONAL", "Column", "CopyAs"]

#: How COPY's text format writes a column's values: ``name`` as is (checked against ``NAME_RE``),
#: ``json`` with its backslashes (and any raw control character) escaped, ``text`` fully escaped,
#: ``int`` as a number.
CopyAs = Literal["name", "json", "text", "int"]


@dataclass(frozen=True)
class Column:
    """One column enqueue writes."""

    #: The job table's column; the bind parameter of the one-job INSERT; the :class:`Prepared`
    #: field holding the value (``kind`` holds the :class:`Kind`, whose name is written).
    name: str
    #: The bulk INSERT's array parameter.
    array: str
    #: The array's element type (the one-job INSERT binds the table column's own type).
    element: TypeEngine[Any]
    copy_as: CopyAs
    #: Bound as text and cast to ``jsonb`` in SQL; a ``Job`` holds it parsed.
    json: bool = False
    nullable: bool = False
    #: Left out of the one-job INSERT when the job has no value (the column's default is NULL):
    #: one parameter more, even NULL, cost the single enqueue a few percent, measured.
    optional: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("queue", "queues", Text(), "name"),
    Column("kind", "kinds", Text(), "name"),
    Column("payload", "payloads", Text(), "json", json=True),
    Column("priority", "priorities", BigInteger(), "int"),
    Column("max_attempts", "max_attempts", BigInteger(), "int"),
    Column("max_crashes", "max_crashes", BigInteger(), "int"),
    Column("concurrency_key", "concurrency_keys", Text(), "text", nullable=True),
    Column("concurrency_limit", "concurrency_limits", BigInteger(), "int", nullable=True),
    Column("meta", "metas", Text(), "json", json=True, nullable=True, optional=True),
    Column("rate_key", "rate_keys", Text(), "text", nullable=True, optional=True),
)
NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
#: The :attr:`Column.optional` columns.
OPTIONAL: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.optional)
