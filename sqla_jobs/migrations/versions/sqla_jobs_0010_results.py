"""sqla-jobs: job results. A nullable ``result`` jsonb column on ``sqla_jobs_outcome``, where the
completion of a kind with ``results=True`` stores what its handler returned.

A nullable column without a default: no rewrite, a brief lock. A worker of an earlier version
stores no result (its kinds have no such option) and reads none.

Revision ID: sqla_jobs_0010
Revises: sqla_jobs_0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0010"
down_revision = "sqla_jobs_0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "sqla_jobs_outcome",
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text())),
        schema=migration_schema(),
    )


def downgrade() -> None:
    op.drop_column("sqla_jobs_outcome", "result", schema=migration_schema())
