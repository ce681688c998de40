"""``sqla-jobs jobs list --linked TABLE.COLUMN=VALUE``: the jobs linked to one row of the
application's, through one of its link tables (``sqla_jobs.link_table``, or any table with a
foreign key to the job table).

The table is vouched for by the catalog before anything reads it: it must exist, and exactly one
of its single-column foreign keys must point at the job table the command reads (the one
``--schema`` names). Its identifiers then come from reflection and are quoted by SQLAlchemy; the
value is bound, and cast by the server to the column's type. Nothing typed on the command line is
ever part of the SQL text, and a name that is not a plain identifier is refused outright.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import MetaData, Select, Table
from sqlalchemy.dialects.postgresql import dialect
from sqlalchemy.orm import Session
from sqlalchemy.types import NullType

from sqla_jobs.cli.common import CLIError
from sqla_jobs.sql import links as links_sql
from sqla_jobs.sql import tables as tables_sql

#: One part of ``[SCHEMA.]TABLE.COLUMN``: a plain identifier, as PostgreSQL stores it.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}\Z")
_FORM = "use [SCHEMA.]TABLE.COLUMN=VALUE, e.g. order_jobs.order_id=42"
_QUOTE = dialect().identifier_preparer.quote  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Linked:
    """A ``--linked`` filter, parsed (not yet checked against the database)."""

    schema: str | None
    table: str
    column: str
    value: str

    @classmethod
    def parse(cls, given: str) -> Linked:
        """``[SCHEMA.]TABLE.COLUMN=VALUE``, each name a plain identifier; a usage error if not."""
        name, sep, value = given.partition("=")
        parts = name.split(".")
        if not sep or not value or len(parts) not in (2, 3):
            raise CLIError(f"invalid --linked {given!r}: {_FORM}")
        bad = [p for p in parts if not _NAME.match(p)]
        if bad:
            raise CLIError(
                f"invalid --linked {given!r}: {bad[0]!r} is not a plain identifier (letters, "
                f"digits, _ and $, not first a digit); {_FORM}"
            )
        schema = parts[0] if len(parts) == 3 else None
        return cls(schema, parts[-2], parts[-1], value)

    @property
    def table_name(self) -> str:
        """The table's name as SQL text, quoted where needed (a bound value, never SQL)."""
        table = _QUOTE(self.table)
        return table if self.schema is None else f"{_QUOTE(self.schema)}.{table}"

    def __str__(self) -> str:
        prefix = "" if self.schema is None else f"{self.schema}."
        return f"{prefix}{self.table}.{self.column}={self.value}"


def statement(session: Session, schema: str | None, linked: Linked) -> Select[Any]:
    """``list_jobs`` of the jobs linked to ``linked``'s row, once the catalog has vouched for its
    table as a link table of the job table in ``schema``. Reads the catalog only; a usage error
    (naming what is wrong) if the table is missing, is not a link table, or lacks the column."""
    found = session.execute(
        links_sql.find_link_table(),
        {"link_table": linked.table_name, "job_table": tables_sql.job_table_name(schema)},
    ).one_or_none()
    if found is None:
        raise CLIError(
            f"--linked {linked}: no table {linked.table_name} (name its schema if it is not on "
            "the search_path: SCHEMA.TABLE.COLUMN=VALUE)"
        )
    job_table = tables_sql.job_table_name(schema)
    if len(found.job_columns) != 1:
        what = (
            "none of its foreign keys points at"
            if not found.job_columns
            else f"several of its columns point at ({', '.join(found.job_columns)})"
        )
        raise CLIError(
            f"--linked {linked}: {found.schema}.{found.name} is not a link table: {what} "
            f"{job_table} (sqla_jobs.link_table builds one)"
        )
    (job_column,) = found.job_columns
    # Reflected in the schema the catalog found it in, so that --schema's schema_translate_map
    # (which moves schema-less tables) leaves it where it is.
    table = Table(
        found.name,
        MetaData(),
        schema=found.schema,
        autoload_with=session.connection(),
        resolve_fks=False,
    )
    column = table.c.get(linked.column)
    if column is None or column.name == job_column:
        columns = ", ".join(c.name for c in table.c if c.name != job_column)
        raise CLIError(
            f"--linked {linked}: {found.schema}.{found.name} has no key column "
            f"{linked.column!r} (its columns other than {job_column}: {columns})"
        )
    if isinstance(column.type, NullType):
        raise CLIError(
            f"--linked {linked}: the type of {found.name}.{column.name} is unknown to SQLAlchemy; "
            "list the jobs with a query of your own"
        )
    return links_sql.list_linked_jobs(table, column.name, job_column)


def bad_value(linked: Linked, error: BaseException) -> CLIError:
    """The usage error for a value the server could not cast to the column's type."""
    first = str(getattr(error, "orig", error)).strip().splitlines()[0]
    return CLIError(
        f"--linked {linked}: {linked.value!r} is not a value of {linked.column}: {first}"
    )
