"""sqla-jobs: the ``completed`` state, and the ``interruptions`` counter.

``completed`` keeps a job whose handler succeeded but whose row could not be deleted (a foreign
key of the application's points at it): terminal, outside every claim index, never run again.
``interruptions`` counts runs stopped at a worker's shutdown and given back, so that the next run
knows it is a re-run without spending the failure or crash budget. Adding a column with a constant
default rewrites nothing (PostgreSQL 11+); the CHECKs are validated against the existing rows.

Revision ID: sqla_jobs_0003
Revises: sqla_jobs_0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0003"
down_revision = "sqla_jobs_0002"
branch_labels = None
depends_on = None

_STATES_BEFORE = "state IN ('pending', 'running', 'dead')"
_STATES = "state IN ('pending', 'running', 'dead', 'completed')"
_COUNTERS_BEFORE = "attempts >= 0 AND crashes >= 0"
_COUNTERS = "attempts >= 0 AND crashes >= 0 AND interruptions >= 0"


def _checks(schema: str | None, states: str, counters: str) -> None:
    for name, condition in (("state", states), ("counters", counters)):
        constraint = op.f(f"sqla_jobs_job_{name}_check")
        op.drop_constraint(constraint, "sqla_jobs_job", type_="check", schema=schema)
        op.create_check_constraint(constraint, "sqla_jobs_job", condition, schema=schema)


def upgrade() -> None:
    schema = migration_schema()
    op.add_column(
        "sqla_jobs_job",
        sa.Column("interruptions", sa.Integer(), server_default=sa.text("0"), nullable=False),
        schema=schema,
    )
    _checks(schema, _STATES, _COUNTERS)


def downgrade() -> None:
    schema = migration_schema()
    # Completed rows have nowhere to go in the older schema: their handlers succeeded, so they
    # are deleted (the application's foreign keys must allow it, as they did not before).
    table = "sqla_jobs_job" if schema is None else f'"{schema}".sqla_jobs_job'
    op.execute(f"DELETE FROM {table} WHERE state = 'completed'")
    _checks(schema, _STATES_BEFORE, _COUNTERS_BEFORE)
    op.drop_column("sqla_jobs_job", "interruptions", schema=schema)
