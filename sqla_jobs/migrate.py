"""``sqla-jobs migrate``: run the shipped revisions without an Alembic setup of your own.

Applications that already use Alembic should include the revisions in their own environment
instead (README, "Migrations"); this is for everyone else, and for the demo.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from ._db import sqlalchemy_url


def alembic_config(url: str, schema: str | None = None) -> Config:
    """An in-memory Alembic config running ``sqla_jobs:migrations`` against ``url``."""
    cfg = Config()
    cfg.set_main_option("script_location", "sqla_jobs:migrations")
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    if schema is not None:
        cfg.attributes["sqla_jobs_schema"] = schema
    return cfg


def upgrade(url: str, *, schema: str | None = None, sql: bool = False) -> None:
    """``alembic upgrade sqla_jobs@head`` on ``url`` (or print the SQL with ``sql=True``)."""
    command.upgrade(alembic_config(url, schema), "sqla_jobs@head", sql=sql)


def downgrade(url: str, *, schema: str | None = None) -> None:
    """``alembic downgrade sqla_jobs@base``: remove every object sqla-jobs created."""
    command.downgrade(alembic_config(url, schema), "sqla_jobs@base")
