"""Alembic environment of this repository: runs the revisions shipped in ``sqla_jobs``.

The database comes from ``DATABASE_URL`` (or ``config.attributes["connection"]`` when a program
hands one in, as the tests do).
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from sqla_jobs import metadata
from sqla_jobs._db import ENV_VAR, sqlalchemy_url
from sqla_jobs.migrations.schema import migration_schema

config = context.config
target_metadata = metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(ENV_VAR)
    if not url:
        raise SystemExit(f"alembic: set {ENV_VAR}=postgresql://user@host/dbname")
    return sqlalchemy_url(url)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


def _run(connection: object) -> None:
    schema = migration_schema()
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        version_table_schema=schema,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
