"""The shop's Alembic environment: its own tables and sqla-jobs' shipped revisions, in one database.

``target_metadata`` lists sqla-jobs' MetaData beside the shop's, so that autogenerate and
``alembic check`` know the job tables as declared (created by the package's revisions, branch
``sqla_jobs``) and never propose to drop them.
"""

from logging.config import fileConfig

import sqla_jobs
from alembic import context
from sqlalchemy import create_engine, pool

from shop.db import database_url
from shop.models import Base

config = context.config

if config.config_file_name is not None:
    fileConfig(config.config_file_name)

target_metadata = [Base.metadata, sqla_jobs.metadata]


def url() -> str:
    """sqlalchemy.url if the ini (or the caller's Config) sets it, else DATABASE_URL."""
    configured = config.get_main_option("sqlalchemy.url")
    return database_url(configured).render_as_string(hide_password=False)


def run_migrations_offline() -> None:
    """``--sql``: print the SQL instead of running it."""
    context.configure(
        url=url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = create_engine(url(), poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
