"""sqla-jobs: the registry of live workers. One row per worker process (name, host, pid, queues,
concurrency, when it started, its last heartbeat and when its row goes stale), written by the
worker itself, for ``sqla-jobs workers``.

A new table, nothing else changes: the job table is not touched, and a worker of an earlier
version, which never writes the registry, keeps working beside it.

Revision ID: sqla_jobs_0006
Revises: sqla_jobs_0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0006"
down_revision = "sqla_jobs_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema = migration_schema()
    tstz = sa.DateTime(timezone=True)
    op.create_table(
        "sqla_jobs_worker",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", tstz, server_default=sa.func.now(), nullable=False),
        sa.Column("heartbeat_at", tstz, server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", tstz, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("sqla_jobs_worker_pkey")),
        schema=schema,
    )


def downgrade() -> None:
    # The registry is rebuilt by the workers themselves (each registers again at its start).
    op.drop_table("sqla_jobs_worker", schema=migration_schema())
