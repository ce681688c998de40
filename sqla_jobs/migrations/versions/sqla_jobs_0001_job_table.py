"""sqla-jobs: the job table, its indexes and storage parameters, and the optional history table.

Revision ID: sqla_jobs_0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0001"
down_revision = None
branch_labels = ("sqla_jobs",)
depends_on = None

# Frozen copy of the DDL: revisions never import the live model, which will move on. Every name is
# wrapped in op.f() so the host application's naming convention cannot rename our objects.
_STORAGE = (
    "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 200, "
    "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.05, "
    "autovacuum_vacuum_cost_limit = 2000, autovacuum_vacuum_cost_delay = 1"
)


def _qualified(schema: str | None, name: str) -> str:
    return name if schema is None else f'"{schema}".{name}'


def upgrade() -> None:
    schema = migration_schema()
    op.create_table(
        "sqla_jobs_job",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("queue", sa.Text(), server_default=sa.text("'default'"), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default=sa.text("10"), nullable=False),
        sa.Column("crashes", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_crashes", sa.Integer(), server_default=sa.text("3"), nullable=False),
        sa.Column("lease_token", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("locked_by", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("concurrency_key", sa.Text(), nullable=True),
        sa.Column("concurrency_limit", sa.Integer(), nullable=True),
        sa.Column("steps", postgresql.JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("sqla_jobs_job_pkey")),
        sa.CheckConstraint("state IN ('pending', 'running', 'dead')", name=op.f("sqla_jobs_job_state_check")),
        sa.CheckConstraint(
            "(state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name=op.f("sqla_jobs_job_lease_check"),
        ),
        sa.CheckConstraint("attempts >= 0 AND crashes >= 0", name=op.f("sqla_jobs_job_counters_check")),
        sa.CheckConstraint("max_attempts >= 1 AND max_crashes >= 1", name=op.f("sqla_jobs_job_budgets_check")),
        sa.CheckConstraint("char_length(last_error) <= 500", name=op.f("sqla_jobs_job_last_error_check")),
        sa.CheckConstraint("char_length(queue) BETWEEN 1 AND 128", name=op.f("sqla_jobs_job_queue_check")),
        sa.CheckConstraint(
            "(concurrency_key IS NULL) = (concurrency_limit IS NULL) AND concurrency_limit >= 1",
            name=op.f("sqla_jobs_job_concurrency_check"),
        ),
        schema=schema,
    )
    op.create_index(
        op.f("sqla_jobs_job_claim_idx"),
        "sqla_jobs_job",
        ["queue", "priority", "run_at", "id"],
        postgresql_where=sa.text("state = 'pending' AND concurrency_key IS NULL"),
        schema=schema,
    )
    op.create_index(
        op.f("sqla_jobs_job_keyed_idx"),
        "sqla_jobs_job",
        ["queue", "concurrency_key", "priority", "run_at", "id"],
        postgresql_where=sa.text("state = 'pending' AND concurrency_key IS NOT NULL"),
        schema=schema,
    )
    op.create_index(
        op.f("sqla_jobs_job_running_idx"),
        "sqla_jobs_job",
        ["concurrency_key"],
        postgresql_where=sa.text("state = 'running'"),
        schema=schema,
    )
    op.execute(f"ALTER TABLE {_qualified(schema, 'sqla_jobs_job')} SET ({_STORAGE})")
    op.create_table(
        "sqla_jobs_history",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("crashes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("sqla_jobs_history_pkey")),
        schema=schema,
    )


def downgrade() -> None:
    schema = migration_schema()
    op.drop_table("sqla_jobs_history", schema=schema)
    # drop_table takes the table's indexes with it.
    op.drop_table("sqla_jobs_job", schema=schema)
