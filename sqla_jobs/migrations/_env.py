"""The Alembic environment that runs sqla-jobs' shipped revisions.

Used by ``sqla-jobs migrate`` (script_location ``sqla_jobs:migrations``) and by this repository's
``alembic/env.py``. Both record the revisions in ``sqla_jobs_alembic_version``
(:data:`~sqla_jobs.model.VERSION_TABLE`), in the schema of the tables. The database
comes from ``sqlalchemy.url`` in the config, else ``DATABASE_URL``; a program may hand in a
connection as ``config.attributes["connection"]``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Connection

from sqla_jobs.db.urls import ENV_VAR, sqlalchemy_url
from sqla_jobs.migrations.schema import migration_schema
from sqla_jobs.model import VERSION_TABLE, metadata


def _url() -> str:
    url = context.config.get_main_option("sqlalchemy.url") or os.environ.get(ENV_VAR)
    if not url:
        raise SystemExit(f"alembic: set {ENV_VAR}=postgresql://user@host/dbname")
    return sqlalchemy_url(url)


def _run_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        version_table=VERSION_TABLE,
        version_table_schema=migration_schema(),
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        version_table_schema=migration_schema(),
    )
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    """Run the migrations Alembic asked for (online or ``--sql``)."""
    if context.is_offline_mode():
        _run_offline()
    else:
        _run_online()
