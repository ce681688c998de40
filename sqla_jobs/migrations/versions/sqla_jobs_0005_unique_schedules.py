"""sqla-jobs: unique jobs and periodic schedules. A unique job's key and the states in which it
holds it, with the partial unique index that makes the key exact across transactions; the table
in which schedulers record the last tick of each schedule.

The two columns are nullable, so nothing is rewritten. The unique index holds only jobs that have
a key, so on an existing table it is built empty (the scan that builds it still reads the table,
under a lock that blocks writes meanwhile: run it when the queue is quiet on a very large table).

Revision ID: sqla_jobs_0005
Revises: sqla_jobs_0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0005"
down_revision = "sqla_jobs_0004"
branch_labels = None
depends_on = None

_UNIQUE_CHECK = (
    "(unique_key IS NULL) = (unique_states IS NULL)"
    " AND unique_states @> ARRAY['pending', 'running']"
)
_UNIQUE_PREDICATE = "unique_key IS NOT NULL AND state = ANY (unique_states)"


def upgrade() -> None:
    schema = migration_schema()
    tstz = sa.DateTime(timezone=True)
    op.add_column("sqla_jobs_job", sa.Column("unique_key", sa.Text(), nullable=True), schema=schema)
    op.add_column(
        "sqla_jobs_job",
        sa.Column("unique_states", postgresql.ARRAY(sa.Text()), nullable=True),
        schema=schema,
    )
    op.create_check_constraint(
        op.f("sqla_jobs_job_unique_check"), "sqla_jobs_job", _UNIQUE_CHECK, schema=schema
    )
    op.create_index(
        op.f("sqla_jobs_job_unique_idx"),
        "sqla_jobs_job",
        ["unique_key"],
        unique=True,
        postgresql_where=sa.text(_UNIQUE_PREDICATE),
        schema=schema,
    )
    op.create_table(
        "sqla_jobs_schedule",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("last_tick_at", tstz, nullable=True),
        sa.Column("last_job_id", sa.BigInteger(), nullable=True),
        sa.Column("next_tick_at", tstz, nullable=True),
        sa.Column("paused_at", tstz, nullable=True),
        sa.Column("seen_at", tstz, server_default=sa.func.now(), nullable=False),
        sa.Column("created_at", tstz, server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", tstz, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("sqla_jobs_schedule_pkey")),
        schema=schema,
    )


def downgrade() -> None:
    schema = migration_schema()
    op.drop_table("sqla_jobs_schedule", schema=schema)
    op.drop_index(op.f("sqla_jobs_job_unique_idx"), "sqla_jobs_job", schema=schema)
    op.drop_constraint(
        op.f("sqla_jobs_job_unique_check"), "sqla_jobs_job", type_="check", schema=schema
    )
    # Unique jobs become plain jobs: nothing is lost but the key.
    op.drop_column("sqla_jobs_job", "unique_states", schema=schema)
    op.drop_column("sqla_jobs_job", "unique_key", schema=schema)
