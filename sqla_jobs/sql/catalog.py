"""Reads of the catalog and of the server, which need no privilege on the queue's tables: where the
job table is, what the current role may do, what of the application's points at the job table,
the database's clock; and ``sqla-jobs migrate``'s lock and version tables.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    Column,
    ColumnElement,
    Delete,
    MetaData,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    column,
    delete,
    func,
    literal_column,
    select,
    text,
    true,
)
from sqlalchemy import (
    table as sa_table,
)
from sqlalchemy.dialects.postgresql import REGCLASS
from sqlalchemy.schema import DropTable
from sqlalchemy.sql.selectable import TableClause

from sqla_jobs.model import (
    VERSION_TABLE,
)
from sqla_jobs.sql.tables import (
    ADVISORY_NAMESPACE,
)

__all__ = [
    "IMMEDIATE_CONSTRAINTS",
    "MIGRATE_LOCK_NAME",
    "blocking_foreign_keys",
    "completion_privileges",
    "database_clock",
    "deferred_job_triggers",
    "drop_shared_version_table",
    "drop_version_table",
    "find_job_tables",
    "forget_shared_versions",
    "lock_migrations",
    "own_versions",
    "scheduler_privileges",
    "shared_versions",
]


def find_job_tables() -> Select[tuple[object, ...]]:
    """Every queue table in the database, one row per schema holding a ``sqla_jobs_job``: the
    schema, whether it is the table the queue's statements reach (``:schema``, or with NULL the one
    an unqualified name resolves to through the search_path), and its column names. The wanted table
    comes first, then the others by schema.

    Reads the catalog only (``pg_class``, ``pg_namespace``, ``pg_attribute``): no lock on the table
    and no privilege on it or its schema needed, so it runs as any role before anything else does.
    """
    return select(
        text(
            "n.nspname AS schema, "
            "CASE WHEN CAST(:schema AS text) IS NULL "
            "THEN (c.oid = to_regclass('sqla_jobs_job')) IS TRUE "
            "ELSE n.nspname = CAST(:schema AS text) END AS wanted, "
            "ARRAY(SELECT CAST(a.attname AS text) FROM pg_attribute AS a "
            "WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum) AS columns "
            "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE c.relname = 'sqla_jobs_job' AND c.relkind IN ('r', 'p') "
            "ORDER BY wanted DESC, n.nspname"
        )
    )


def scheduler_privileges() -> Select[Any]:
    """Whether the current role may run the scheduler: ``enqueue`` (INSERT on the job table named
    ``job_table``) and ``schedules`` (SELECT, INSERT, UPDATE on ``schedule_table``). The names
    are bound, schema-qualified as :func:`job_table_name` renders them. Reads the catalog only."""
    schedule_table = bindparam("schedule_table", type_=Text)
    # A list of privileges is true when ANY of them is held: each is asked for on its own.
    return select(
        func.has_table_privilege(bindparam("job_table", type_=Text), "INSERT").label("enqueue"),
        and_(
            *(func.has_table_privilege(schedule_table, p) for p in ("SELECT", "INSERT", "UPDATE"))
        ).label("schedules"),
    )


def completion_privileges() -> Select[Any]:
    """Whether the current role may complete a job in its own transaction: ``complete`` (SELECT
    and DELETE on the job table bound as ``job_table``) and ``history`` (INSERT on the table
    bound as ``history_table``). Names as :func:`job_table_name` renders them; catalog only."""
    job_table = bindparam("job_table", type_=Text)
    return select(
        and_(
            func.has_table_privilege(job_table, "SELECT"),
            func.has_table_privilege(job_table, "DELETE"),
        ).label("complete"),
        func.has_table_privilege(bindparam("history_table", type_=Text), "INSERT").label("history"),
    )


def blocking_foreign_keys() -> Select[Any]:
    """How many foreign keys of the application's point at the job table (bound as
    ``job_table``, text, as :func:`job_table_name` renders it) with an action that refuses the
    delete of a referenced row (``NO ACTION``, ``RESTRICT``). Reads the catalog only."""
    constraint = sa_table(
        "pg_constraint",
        column("contype"),
        column("confrelid"),
        column("confdeltype"),
        schema="pg_catalog",
    )
    return (
        select(func.count())
        .select_from(constraint)
        .where(
            constraint.c.contype == "f",
            constraint.c.confrelid == cast(bindparam("job_table", type_=Text), REGCLASS),
            constraint.c.confdeltype.in_(["a", "r"]),
        )
    )


def deferred_job_triggers() -> Select[Any]:
    """How many triggers on the job table (bound as ``job_table``, text, as
    :func:`job_table_name` renders it) fire only at commit (``INITIALLY DEFERRED``): those of the
    application's deferrable foreign keys to it (Django makes them so), and constraint triggers of
    its own. A worker whose claim connection finds any runs :data:`IMMEDIATE_CONSTRAINTS` first
    in each pipeline that writes outcomes. Reads the catalog only."""
    trigger = TableClause(
        "pg_trigger", column("tgrelid"), column("tginitdeferred"), schema="pg_catalog"
    )
    return (
        select(func.count())
        .select_from(trigger)
        .where(
            trigger.c.tgrelid == cast(bindparam("job_table", type_=Text), REGCLASS),
            trigger.c.tginitdeferred.is_(true()),
        )
    )


#: Checks what the rest of the transaction does at each statement's end, deferred constraints
#: included: a violation found at a pipeline's implicit commit leaves psycopg's pipeline unusable
#: (the connection lost, the outcomes retried forever), one found at the statement's end is that
#: statement's error, which the worker handles (a completion kept as ``completed``).
IMMEDIATE_CONSTRAINTS = "SET CONSTRAINTS ALL IMMEDIATE"


def database_clock() -> Select[Any]:
    """The database's ``now()``: what schedule listings compute the next tick from."""
    return select(func.now())


#: The name of the advisory lock ``sqla-jobs migrate`` holds while it migrates one schema.
MIGRATE_LOCK_NAME = "sqla_jobs.migrate"


#: The version table of the schema's Alembic environments other than ours: the application's own,
#: which may hold sqla-jobs' revisions too (the README's recipe), and an earlier sqla-jobs migrate's.
#: Alembic's layout: one row per head.
shared_versions = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), primary_key=True),
)


#: sqla-jobs' own version table, as Alembic creates it.
own_versions = Table(
    VERSION_TABLE,
    MetaData(),
    Column("version_num", String(32), primary_key=True),
)


def lock_migrations() -> Select[tuple[object]]:
    """Wait for the advisory lock of ``sqla-jobs migrate`` on schema ``schema_name``
    (:data:`ADVISORY_NAMESPACE`, ``hashtext('sqla_jobs.migrate:' || schema_name)``) and hold it
    until the transaction ends: two runs at once (a deploy's replicas) migrate one after the
    other, the second finding nothing left to do. Locks nothing else."""
    schema = func.coalesce(bindparam("schema_name", type_=Text), literal_column("''"))
    name: ColumnElement[str] = literal_column(f"'{MIGRATE_LOCK_NAME}:'") + schema
    return select(
        func.pg_advisory_xact_lock(literal_column(str(ADVISORY_NAMESPACE)), func.hashtext(name))
    )


def forget_shared_versions() -> Delete:
    """Delete the rows ``revisions`` (sqla-jobs' own) from ``alembic_version``, leaving every
    other row (the application's revisions) as it is. Locks the rows it deletes; a scan of a table
    of a row per head. Returns nothing."""
    column = shared_versions.c.version_num
    return delete(shared_versions).where(
        column == func.any(bindparam("revisions", type_=ARRAY(Text)))
    )


def drop_shared_version_table() -> DropTable:
    """Drop ``alembic_version``, once :func:`forget_shared_versions` left it empty: an earlier
    ``sqla-jobs migrate`` created it, and an application that needs one again gets it back from
    its own Alembic environment. Takes an ACCESS EXCLUSIVE lock on it until the transaction ends."""
    return DropTable(shared_versions)


def drop_version_table() -> DropTable:
    """Drop sqla-jobs' own version table, after a downgrade to base emptied it (Alembic keeps an
    empty one). Takes an ACCESS EXCLUSIVE lock on it until the transaction ends."""
    return DropTable(own_versions)
