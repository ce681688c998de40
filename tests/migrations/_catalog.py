"""What a database holds, read from PostgreSQL's catalogs, for the migration tests."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from sqla_jobs.db.urls import sqlalchemy_url

Rows = set[tuple[Any, ...]]
#: Alembic's own version table, and the one of sqla-jobs' environment (sqla-jobs migrate, the
#: repository's alembic.ini).
SHARED_VERSIONS = "alembic_version"
OWN_VERSIONS = "sqla_jobs_alembic_version"
#: The version table's own objects (table, primary key, row type): Alembic keeps the table, empty,
#: after a downgrade to base, and the model does not declare it.
_VERSIONS = r"sqla\_jobs\_alembic\_version%"


def connect(url: str) -> Connection:
    """An autocommit connection to ``url``; no pool, so closing it leaves nothing connected."""
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    return engine.connect()


def execute_sql(url: str, *statements: str) -> None:
    """Run ``statements`` on ``url``, each committed at once."""
    with connect(url) as conn:
        for statement in statements:
            conn.execute(text(statement))


def rows(conn: Connection, sql: str, **params: Any) -> Rows:
    """The result of ``sql`` as a set of tuples."""
    return {tuple(r) for r in conn.execute(text(sql), params)}


def sqla_jobs_objects(url: str) -> set[tuple[str, str]]:
    """Every relation (table, index, sequence), constraint and type whose name starts with
    sqla_jobs, in any schema, as (kind, "schema.name"); the version table's aside, and NOT NULL
    constraints too (PostgreSQL 18 catalogues them, one per column: they go with their table)."""
    with connect(url) as conn:
        return {
            (kind, name)
            for kind, name in rows(
                conn,
                r"""
                SELECT 'class', n.nspname || '.' || c.relname FROM pg_class c
                  JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.relname LIKE 'sqla\_jobs%' AND c.relname NOT LIKE :versions
                UNION ALL
                SELECT 'constraint', n.nspname || '.' || k.conname FROM pg_constraint k
                  JOIN pg_namespace n ON n.oid = k.connamespace
                 WHERE k.conname LIKE 'sqla\_jobs%' AND k.conname NOT LIKE :versions
                   AND k.contype <> 'n'
                UNION ALL
                SELECT 'type', n.nspname || '.' || t.typname FROM pg_type t
                  JOIN pg_namespace n ON n.oid = t.typnamespace
                 WHERE t.typname LIKE 'sqla\_jobs%' AND t.typname NOT LIKE :versions
                """,
                versions=_VERSIONS,
            )
        }


def tables(url: str) -> set[str]:
    """``schema.table`` of every table outside the system schemas."""
    with connect(url) as conn:
        found = rows(
            conn,
            "SELECT schemaname, tablename FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
        )
    return {f"{schema}.{table}" for schema, table in found}


def constraint_names(url: str) -> set[str]:
    """The name of every constraint in the database."""
    with connect(url) as conn:
        return {name for (name,) in rows(conn, "SELECT conname FROM pg_constraint")}


def version_rows(url: str, schema: str = "public", table: str = OWN_VERSIONS) -> set[str]:
    """The revisions recorded in ``schema.table``: by default, sqla-jobs' own environment's."""
    with connect(url) as conn:
        return {r for (r,) in rows(conn, f'SELECT version_num FROM "{schema}"."{table}"')}


def catalog(conn: Connection, schema: str) -> dict[str, Rows]:
    """The sqla_jobs tables of ``schema`` as PostgreSQL describes them, with ``schema.`` removed
    from every definition so that two schemas can be compared."""

    def unqualified(found: Rows) -> Rows:
        return {
            tuple(v.replace(f"{schema}.", "") if isinstance(v, str) else v for v in row)
            for row in found
        }

    joined = "pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    where = (
        r"n.nspname = :schema AND c.relname LIKE 'sqla\_jobs%' "
        rf"AND c.relname NOT LIKE '{_VERSIONS}'"
    )
    columns = f"""
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, a.attidentity, pg_get_expr(d.adbin, d.adrelid)
          FROM {joined} JOIN pg_attribute a ON a.attrelid = c.oid
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
         WHERE {where} AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped"""
    constraints = f"""
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
          FROM {joined} JOIN pg_constraint k ON k.conrelid = c.oid WHERE {where}"""
    indexes = r"""
        SELECT tablename, indexname, indexdef FROM pg_indexes
         WHERE schemaname = :schema AND tablename LIKE 'sqla\_jobs%'
           AND tablename NOT LIKE :versions"""
    return {
        "columns": unqualified(rows(conn, columns, schema=schema)),
        "constraints": rows(conn, constraints, schema=schema),
        "indexes": unqualified(rows(conn, indexes, schema=schema, versions=_VERSIONS)),
        "relations": rows(
            conn, f"SELECT c.relname, c.relkind FROM {joined} WHERE {where}", schema=schema
        ),
        "storage": rows(
            conn, f"SELECT c.relname, c.reloptions::text FROM {joined} WHERE {where}", schema=schema
        ),
    }
