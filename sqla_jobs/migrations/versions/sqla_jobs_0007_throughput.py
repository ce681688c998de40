"""sqla-jobs: per-minute throughput. One row per minute, queue and kind: counts of outcomes and the
sums of run times and pickup delays, added to by each worker at its reaper's beat, for the
dashboard's chart (completed jobs are deleted, so they cannot be counted afterwards).

A new table, nothing else changes: a worker of an earlier version, which never writes it, keeps
working beside it; a worker of this version on a database not yet migrated logs once and carries on.

Revision ID: sqla_jobs_0007
Revises: sqla_jobs_0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0007"
down_revision = "sqla_jobs_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sqla_jobs_throughput",
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        *(
            sa.Column(c, sa.BigInteger(), server_default="0", nullable=False)
            for c in ("completed", "failed", "dead", "cancelled", "snoozed", "crashed")
        ),
        sa.Column("runs", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("run_seconds", sa.Double(), server_default="0", nullable=False),
        sa.Column("pickups", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("pickup_seconds", sa.Double(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("minute", "queue", "kind", name=op.f("sqla_jobs_throughput_pkey")),
        schema=migration_schema(),
    )


def downgrade() -> None:
    # Figures for a chart: losing them loses no job.
    op.drop_table("sqla_jobs_throughput", schema=migration_schema())
