"""enqueue_many's COPY: the rows as COPY text, and the COPY itself on the session's own psycopg
connection (sync, or async from inside ``AsyncSession.run_sync``'s greenlet).

The columns, their order and how each is written come from :data:`sqla_jobs.enqueue.row.COLUMNS`: the
row is the reserved id, those columns, and run_at (:data:`sqla_jobs.sql.enqueue.COPY_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy.util import await_only

from sqla_jobs.enqueue.row import COLUMNS, Batch, Column

#: COPY's text format: what a text value must escape, and its NULL.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
NULL = "\\N"
#: Rows per string handed to ``Copy.write`` (about 1 MB for small payloads).
ROWS_PER_WRITE = 256
#: A row up to its run_at: the id and the columns. ``%`` formats a tuple of str and int in one call,
#: at about the speed of an f-string, where a ``str()`` per value and ``"\t".join`` cost more.
_ROW = "\t".join(["%s"] * (len(COLUMNS) + 1)) + "\t"


def _json(values: list[str]) -> list[str]:
    # pydantic writes no raw tab or newline, and only JSON's own escapes have a backslash: look at
    # all of them at once, and escape one by one only what needs it.
    text = "".join(values)
    if "\n" in text or "\t" in text or "\r" in text:
        return [v.translate(_ESCAPES) for v in values]
    if "\\" in text:
        return [v.replace("\\", "\\\\") for v in values]
    return values


def _json_or_null(values: list[str | None]) -> list[str]:
    # Most batches have no meta at all: one count, no per-value work.
    if values.count(None) == len(values):
        return [NULL] * len(values)
    texts = _json([v for v in values if v is not None])
    it = iter(texts)
    return [NULL if v is None else next(it) for v in values]


def _text(values: list[str | None]) -> list[str]:
    if values.count(None) == len(values):
        return [NULL] * len(values)
    return [NULL if v is None else v.translate(_ESCAPES) for v in values]


def _int(values: list[int | None]) -> list[int | str]:
    return [NULL if v is None else v for v in values]


def _as_is(values: list[Any]) -> list[Any]:
    return values


def _formatter(column: Column) -> Callable[[list[Any]], list[Any]]:
    """How a column's values are written: names as they are (checked against ``NAME_RE``), numbers
    by ``%s``, JSON and free text escaped, NULL as ``\\N``."""
    if column.copy_as == "json":
        return _json_or_null if column.nullable else _json
    if column.copy_as == "text":
        return _text
    if column.copy_as == "int" and column.nullable:
        return _int
    return _as_is


_FORMATTERS = tuple(_formatter(c) for c in COLUMNS)


def text(batch: Batch, ids: list[int], run_at: datetime) -> Iterator[str]:
    """The batch as COPY text-format data, in strings of :data:`ROWS_PER_WRITE` rows.

    Formatted here rather than by ``Copy.write_row``, which adapts each value of each row one by
    one (the largest part of enqueue_many's time, profiled). The values are already checked, and
    hold no lone surrogate (:mod:`sqla_jobs.enqueue.text`): the encoding cannot fail halfway.
    """
    # run_at is the batch's: written into the row's format once (an ISO date holds no "%").
    row_format = _ROW + run_at.isoformat() + "\n"
    for start in range(0, len(ids), ROWS_PER_WRITE):
        stop = start + ROWS_PER_WRITE
        columns = [f(c[start:stop]) for f, c in zip(_FORMATTERS, batch.columns, strict=True)]
        yield "".join([row_format % row for row in zip(ids[start:stop], *columns, strict=True)])


def copy(driver: Any, sql: str, data: Iterable[str]) -> None:
    """Run ``sql`` (a ``COPY ... FROM STDIN``) on ``driver``, a psycopg ``Connection`` or, inside a
    greenlet of SQLAlchemy's asyncio (``run_sync``), an ``AsyncConnection``; send ``data``. An
    exception from ``data`` (a payload that fails validation) ends the COPY with an error."""
    if isinstance(driver, psycopg.AsyncConnection):
        await_only(_copy_async(driver, sql, data))
        return
    with driver.cursor() as cur, cur.copy(sql) as stream:
        for chunk in data:
            stream.write(chunk)


async def _copy_async(driver: psycopg.AsyncConnection[Any], sql: str, data: Iterable[str]) -> None:
    async with driver.cursor() as cur, cur.copy(sql) as stream:
        for chunk in data:
            await stream.write(chunk)
