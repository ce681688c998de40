"""Jobs linked to the application's own rows: an association table in the application's MetaData,
with a foreign key to the row and one to the job, both ``ON DELETE CASCADE``.

Why a table of the application's, and real foreign keys: it is what SQLAlchemy and Alembic already
know (``relationship(secondary=...)``, joins inferred from the keys, autogenerate), and the keys
keep it exact with no code of ours running: a job's completion or prune deletes its links, the
deletion of a row deletes its links and leaves its jobs alone, and no link can point at a job or a
row that is not there. A job without links costs nothing at enqueue or claim. What a link table
costs: every deletion of a job (a completion, a prune) probes the table's ``job_id`` index once,
linked or not (the foreign key's cascade is a per-row trigger on the job table), about 2.5
microseconds of server time per job for each link table in the database (README, "Cost").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, ColumnElement, ForeignKey, Insert, MetaData, Table, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sqla_jobs.errors import ConfigurationError, InvalidOptionError
from sqla_jobs.model import JOB_TABLE, Job
from sqla_jobs.sql import links as links_sql

#: ``enqueue(link=...)``: the rows to link the job to, by link table, e.g. ``{order_jobs: 42}``.
LinkArg = Mapping[Table, Any] | None
#: ``enqueue_many(link=...)``: one mapping for every job, or one mapping (or None) per payload.
LinksArg = Mapping[Table, Any] | Sequence[Mapping[Table, Any] | None] | None
#: The column of a link table that points at the job (``link_table`` names it so).
JOB_COLUMN = "job_id"
_JOB_BIND = {"mapper": inspect(Job)}
_SAVEPOINT, _ROLLBACK_TO_SAVEPOINT, _RELEASE_SAVEPOINT = links_sql.LINK_SAVEPOINT
_FOREIGN_KEY_VIOLATION = "23503"


def link_table(
    name: str,
    metadata: MetaData,
    target: Any,
    *,
    column: str | None = None,
    schema: str | None = None,
) -> Table:
    """A link table between the rows of ``target`` (a primary-key column: ``Order.id``) and jobs,
    in the application's ``metadata``: create it with the application's own migrations.

    Columns: ``column`` (default ``<target table>_<target column>``), a foreign key to
    ``target`` ``ON DELETE CASCADE``, and ``job_id``, a foreign key to ``sqla_jobs_job.id`` ``ON
    DELETE CASCADE``; the primary key is the two, in that order (a row's jobs are one index range),
    and ``job_id`` has an index of its own (the cascade from a job's deletion uses it). So: a job's
    completion or prune deletes its links, the deletion of a row deletes its links but not its
    jobs, and the worker never meets a foreign key it cannot satisfy. Link at enqueue with
    ``jobs.enqueue(session, payload, link={table: row_id})``; find with
    ``select(Job).join(table).where(table.c.<column> == row_id)``.
    """
    key = _column(target)
    return Table(
        name,
        metadata,
        Column(
            column or f"{key.table.name}_{key.name}",
            ForeignKey(key, ondelete="CASCADE"),
            primary_key=True,
        ),
        Column(JOB_COLUMN, ForeignKey(Job.id, ondelete="CASCADE"), primary_key=True, index=True),
        schema=schema,
    )


def _column(target: Any) -> Any:
    element = target.__clause_element__() if hasattr(target, "__clause_element__") else target
    if not isinstance(element, ColumnElement) or getattr(element, "table", None) is None:
        raise ConfigurationError(
            f"link_table: the target must be a table's column (Order.id), got {target!r}"
        )
    return element


@dataclass(frozen=True)
class Link:
    """A link table as enqueue writes it: the table, its key column, its job column."""

    table: Table
    key: str
    job: str


@functools.cache
def link_of(table: Table) -> Link:
    """The :class:`Link` of ``table``, checked: one column with a foreign key to the job table's
    id, and a primary key of that column and one other, the row's key (what
    :func:`link_table` builds). Raises :class:`InvalidOptionError` naming what is missing."""
    jobs = [c.name for c in table.c if any(_to_jobs(fk) for fk in c.foreign_keys)]
    if len(jobs) != 1:
        raise InvalidOptionError(
            f"link: {table.fullname} is not a link table: it needs one column with a foreign key "
            f"to {JOB_TABLE}.id, and has {len(jobs)} (sqla_jobs.link_table builds one)"
        )
    keys = [c.name for c in table.primary_key.columns if c.name != jobs[0]]
    if len(keys) != 1 or len(table.primary_key.columns) != 2:
        raise InvalidOptionError(
            f"link: {table.fullname} is not a link table: its primary key must be two columns, "
            f"the row's key and {jobs[0]} (sqla_jobs.link_table builds one)"
        )
    return Link(table, keys[0], jobs[0])


def _to_jobs(fk: ForeignKey) -> bool:
    return fk.target_fullname.split(".")[-2:] == [JOB_TABLE, "id"]


Checked = list[tuple[Link, Any]]


def check(link: LinkArg, what: str = "link") -> Checked:
    """``enqueue``'s ``link``, checked before any SQL: each key a link table (or a class mapped
    to one), each value a key of the table's key column's Python type (never None: a row not yet
    flushed has no id). Raises :class:`InvalidOptionError`, naming ``what``."""
    if link is None:
        return []
    if not isinstance(link, Mapping):
        raise InvalidOptionError(
            f"{what} must be a mapping of link tables to keys ({{order_jobs: 42}}), "
            f"got {type(link).__qualname__}"
        )
    checked = []
    for table, key in link.items():
        table = getattr(table, "__table__", table)
        if not isinstance(table, Table):
            raise InvalidOptionError(
                f"{what}: {table!r} is not a table; the keys are link tables (sqla_jobs.link_table)"
            )
        spec = link_of(table)
        _check_key(spec, key, what)
        checked.append((spec, key))
    return checked


def check_many(link: LinksArg, count: int) -> list[Checked] | None:
    """``enqueue_many``'s ``link``: one mapping for every job, or a sequence of one mapping (or
    None) per payload; checked as :func:`check` checks one. One list of links per job, or None."""
    if link is None:
        return None
    if isinstance(link, Mapping):
        return [check(link)] * count
    if isinstance(link, (str, bytes)) or not isinstance(link, Sequence):
        raise InvalidOptionError(
            "link must be a mapping (for every job) or a sequence of one mapping or None per "
            f"job, got {type(link).__qualname__}"
        )
    if len(link) != count:
        raise InvalidOptionError(
            f"link has {len(link)} entries for {count} payloads; give one per payload, or one "
            "mapping for all"
        )
    return [check(m, f"link of payload {i}") for i, m in enumerate(link)]


def _check_key(link: Link, key: Any, what: str) -> None:
    column = f"{link.table.fullname}.{link.key}"
    if key is None:
        raise InvalidOptionError(
            f"{what}: the key for {column} is None; flush the session first (session.flush()) "
            "so that the row has its id"
        )
    try:
        expected = link.table.c[link.key].type.python_type
    except NotImplementedError:  # a type SQLAlchemy cannot name: the server checks it
        return
    if not isinstance(key, expected) or (isinstance(key, bool) and expected is not bool):
        raise InvalidOptionError(
            f"{what}: {column} takes {expected.__name__}, got {type(key).__qualname__} {key!r}"
        )


def insert(
    session: Session,
    per_job: Sequence[Checked],
    ids: Sequence[int],
    schema: str | None,
    *,
    fresh: bool = True,
) -> None:
    """Link the jobs ``ids`` as ``per_job`` says (one list per job, in the same order), in the
    session's transaction, one statement per link table (:func:`links_sql.insert_links`).

    ``fresh``: every job was inserted by this transaction, so no worker can complete one before
    the links are in. Otherwise (a unique job's duplicate: the job holding the key, perhaps
    running) each statement goes in a savepoint, and a foreign key violation (the job completed
    between the statement's snapshot and the key's check) is tried once more: under READ
    COMMITTED the second try no longer sees that job and links the rest, so the caller's
    transaction is never aborted by a job that finished. Under REPEATABLE READ the second try
    fails the same way, and the error is raised with the transaction rolled back to before the
    links (still usable).
    """
    pairs: dict[Link, dict[tuple[Any, int], None]] = {}
    for links, job_id in zip(per_job, ids, strict=True):
        for link, key in links:
            pairs.setdefault(link, {})[(key, job_id)] = None
    if not pairs:
        return
    conn = session.connection(bind_arguments=_JOB_BIND)
    # Table by table in a fixed order, so two transactions linking to several tables take the
    # link tables' locks in one order.
    for link in sorted(pairs, key=lambda lk: lk.table.fullname):
        keys, job_ids = zip(*pairs[link], strict=True)
        stmt, params = _insert_links(link, schema), {"keys": list(keys), "ids": list(job_ids)}
        if fresh:
            conn.execute(stmt, params)
            continue
        for attempt in (1, 2):
            conn.exec_driver_sql(_SAVEPOINT)
            try:
                conn.execute(stmt, params)
            except IntegrityError as exc:
                conn.exec_driver_sql(_ROLLBACK_TO_SAVEPOINT)
                conn.exec_driver_sql(_RELEASE_SAVEPOINT)
                if attempt == 2 or _sqlstate(exc) != _FOREIGN_KEY_VIOLATION:
                    raise
                continue
            conn.exec_driver_sql(_RELEASE_SAVEPOINT)
            break


def _sqlstate(exc: IntegrityError) -> str | None:
    # psycopg 3 names it sqlstate, psycopg2 pgcode.
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return None if code is None else str(code)


@functools.lru_cache(maxsize=64)
def _insert_links(link: Link, schema: str | None) -> Insert:
    return links_sql.insert_links(link.table, link.key, link.job, schema)
