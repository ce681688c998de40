"""sqla-jobs: rate limits. The job's ``rate_key`` column, the rate limiter table, and the claim
indexes rebuilt without the rate limited jobs (which a claim of their own reads, through an index
of their own), so that the plain and keyed claims never scan past due jobs held by a limit.

The column is added without a default (no table rewrite). The indexes are built with a plain
``CREATE INDEX``: ``sqla-jobs migrate`` runs every revision in one transaction, where
``CREATE INDEX CONCURRENTLY`` cannot run; the build blocks writes to the job table for as long as
it reads the pending rows (the indexes are partial). The old indexes are dropped after the new
ones exist.

A worker of an earlier version claims rate limited jobs as if they had no limit (its claim does
not know ``rate_key``): upgrade every worker before relying on a limit.

Revision ID: sqla_jobs_0009
Revises: sqla_jobs_0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0009"
down_revision = "sqla_jobs_0008"
branch_labels = None
depends_on = None

_JOB = "sqla_jobs_job"
_CLAIM = ["queue", "priority", "run_at", "id"]
_KEYED = ["queue", "concurrency_key", "priority", "run_at", "id"]


def upgrade() -> None:
    schema = migration_schema()
    op.add_column(_JOB, sa.Column("rate_key", sa.Text(), nullable=True), schema=schema)
    op.create_table(
        "sqla_jobs_rate_limiter",
        sa.Column("rate_key", sa.Text(), nullable=False),
        sa.Column(
            "starts",
            postgresql.ARRAY(sa.DateTime(timezone=True)),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column("allowed", sa.Integer(), nullable=True),
        sa.Column("per", sa.Interval(), nullable=True),
        sa.Column(
            "free_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("rate_key", name=op.f("sqla_jobs_rate_limiter_pkey")),
        schema=schema,
    )
    _swap_indexes(schema, "AND rate_key IS NULL")
    op.create_index(
        op.f("sqla_jobs_job_rated_idx"),
        _JOB,
        ["queue", "rate_key", "priority", "run_at", "id"],
        postgresql_where=sa.text("state = 'pending' AND rate_key IS NOT NULL"),
        schema=schema,
    )


def downgrade() -> None:
    schema = migration_schema()
    op.drop_index(op.f("sqla_jobs_job_rated_idx"), table_name=_JOB, schema=schema)
    _swap_indexes(schema, "")
    op.drop_table("sqla_jobs_rate_limiter", schema=schema)
    # Rate limited jobs become plain jobs: their limit goes with the column.
    op.drop_column(_JOB, "rate_key", schema=schema)


def _swap_indexes(schema: str | None, rated: str) -> None:
    # Built under a temporary name, then the old one dropped and the new one renamed: the claims
    # always have an index to use.
    for name, columns, keyed in (("claim", _CLAIM, "IS NULL"), ("keyed", _KEYED, "IS NOT NULL")):
        final = f"{_JOB}_{name}_idx"
        op.create_index(
            op.f(f"{final}_new"),
            _JOB,
            columns,
            postgresql_where=sa.text(f"state = 'pending' AND concurrency_key {keyed} {rated}".strip()),
            schema=schema,
        )
        op.drop_index(op.f(final), table_name=_JOB, schema=schema)
        prefix = f'"{schema}".' if schema else ""
        op.execute(f'ALTER INDEX {prefix}"{final}_new" RENAME TO "{final}"')
