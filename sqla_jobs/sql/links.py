"""Jobs linked to the application's own rows (:mod:`sqla_jobs.links`): the link rows written at
enqueue, the check that a table is a link table, and the listing of a row's jobs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Insert,
    Select,
    Text,
    bindparam,
    cast,
    column,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.selectable import TableClause

from sqla_jobs.sql.listings import list_jobs
from sqla_jobs.sql.tables import (
    job,
)

__all__ = [
    "EXAMPLE_LINK",
    "LINK_SAVEPOINT",
    "find_link_table",
    "insert_links",
    "list_linked_jobs",
]


#: What the link builders compile for when given no table: the shape ``sqla_jobs.link_table``
#: builds, a row's key and a job's id (the golden files show the SQL for it).
EXAMPLE_LINK = TableClause(
    "order_jobs", column("order_id", BigInteger), column("job_id", BigInteger)
)


def insert_links(
    link: TableClause = EXAMPLE_LINK,
    key: str = "order_id",
    job_key: str = "job_id",
    schema: str | None = None,
) -> Insert:
    """Link jobs to rows through the application's link table ``link``: one row per pair of the
    parallel arrays ``keys`` (of the ``key`` column's type) and ``ids`` (job ids), ``ON CONFLICT
    DO NOTHING`` (a link made twice is made once), for the jobs the statement's snapshot sees
    (a job already gone is not linked). No lock of its own: the foreign key's check locks each
    job ``FOR KEY SHARE`` (as the job table's owner, so the caller needs no ``UPDATE`` on it),
    which makes a worker's completion of an *existing* job wait for the caller's commit; a job
    enqueued in the same transaction is seen by no worker yet. The job table is named with
    ``schema`` here: a ``schema_translate_map`` would move the application's link table along
    with it. Primary key probes on the job table; the link table's primary key takes the rows.
    """
    jobs = TableClause(job.name, column("id", BigInteger), schema=schema)
    pairs = (
        func.unnest(
            bindparam("keys", type_=ARRAY(link.c[key].type)),
            bindparam("ids", type_=ARRAY(BigInteger)),
        )
        .table_valued("key", "id")
        .render_derived(name="pairs")
    )
    rows = select(pairs.c.key, jobs.c.id).join_from(pairs, jobs, jobs.c.id == pairs.c.id)
    return pg_insert(link).from_select([key, job_key], rows).on_conflict_do_nothing()


#: SAVEPOINT, ROLLBACK TO and RELEASE of the savepoint around links to jobs this enqueue did not
#: insert (a unique job's duplicate): the one job it links may complete meanwhile.
LINK_SAVEPOINT = (
    "SAVEPOINT sqla_jobs_link",
    "ROLLBACK TO SAVEPOINT sqla_jobs_link",
    "RELEASE SAVEPOINT sqla_jobs_link",
)


def find_link_table() -> Select[Any]:
    """The relation named ``link_table`` (text: a name quoted as SQL, schema-qualified or
    resolved through the search_path): its schema, its name, and the columns of its single-column
    foreign keys to the job table ``job_table`` (text, as :func:`job_table_name` renders it). No
    row: no such relation. No column: it is not a link table. For ``sqla-jobs jobs list
    --linked``, which reads such a table only once this has vouched for it. Reads the catalog
    only (no privilege on either table needed)."""
    return select(
        text(
            "n.nspname AS schema, c.relname AS name, "
            "ARRAY(SELECT CAST(a.attname AS text) FROM pg_constraint AS k "
            "JOIN pg_attribute AS a ON a.attrelid = k.conrelid AND a.attnum = k.conkey[1] "
            "WHERE k.conrelid = c.oid AND k.contype = 'f' AND cardinality(k.conkey) = 1 "
            "AND k.confrelid = to_regclass(CAST(:job_table AS text)) "
            "ORDER BY a.attname) AS job_columns "
            "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(CAST(:link_table AS text))"
        )
    )


def list_linked_jobs(
    link: TableClause = EXAMPLE_LINK, key: str = "order_id", job_key: str = "job_id"
) -> Select[Any]:
    """:func:`list_jobs` (same parameters and columns), only the jobs linked through the
    application's link table ``link`` to the rows whose ``key`` column equals ``linked`` (text,
    cast by the server to that column's type: a value that cannot be one is an error before
    anything is read). An EXISTS, so a job linked twice is listed once. No locks; the link
    table's primary key (key first) finds the jobs, the job table's primary key reads them."""
    value = cast(bindparam("linked", type_=Text), link.c[key].type)
    linked = (
        select(link.c[job_key]).where(link.c[job_key] == job.c.id, link.c[key] == value).exists()
    )
    return list_jobs().where(linked)
