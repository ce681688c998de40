"""sqla-jobs: operations. The ``cancelled`` state and a stored cancel request; when a job finished;
tags (``meta``) and an error per failed attempt; what history keeps; paused queues.

Every column added is nullable or has a constant default, so nothing is rewritten; the state CHECK
is validated against the existing rows. The index on terminal rows serves retention and the
operator's listings; it holds only finished jobs, never pending or running ones.

Revision ID: sqla_jobs_0004
Revises: sqla_jobs_0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sqla_jobs.migrations.schema import migration_schema

revision = "sqla_jobs_0004"
down_revision = "sqla_jobs_0003"
branch_labels = None
depends_on = None

_STATES_BEFORE = "state IN ('pending', 'running', 'dead', 'completed')"
_STATES = "state IN ('pending', 'running', 'dead', 'completed', 'cancelled')"
_TERMINAL = "state IN ('completed', 'dead', 'cancelled')"


def _state_check(schema: str | None, condition: str) -> None:
    name = op.f("sqla_jobs_job_state_check")
    op.drop_constraint(name, "sqla_jobs_job", type_="check", schema=schema)
    op.create_check_constraint(name, "sqla_jobs_job", condition, schema=schema)


def upgrade() -> None:
    schema = migration_schema()
    tstz = sa.DateTime(timezone=True)
    for name, type_ in (
        ("cancel_requested_at", tstz),
        ("finished_at", tstz),
        ("meta", postgresql.JSONB()),
        ("errors", postgresql.JSONB()),
    ):
        op.add_column("sqla_jobs_job", sa.Column(name, type_, nullable=True), schema=schema)
    _state_check(schema, _STATES)
    op.create_index(
        op.f("sqla_jobs_job_finished_idx"),
        "sqla_jobs_job",
        ["state", "finished_at"],
        postgresql_where=sa.text(_TERMINAL),
        schema=schema,
    )
    op.add_column(
        "sqla_jobs_history",
        sa.Column("outcome", sa.Text(), server_default=sa.text("'completed'"), nullable=False),
        schema=schema,
    )
    op.add_column("sqla_jobs_history", sa.Column("last_error", sa.Text()), schema=schema)
    for name in ("errors", "steps", "meta"):
        op.add_column(
            "sqla_jobs_history", sa.Column(name, postgresql.JSONB(), nullable=True), schema=schema
        )
    op.create_index(
        op.f("sqla_jobs_history_finished_idx"), "sqla_jobs_history", ["finished_at"], schema=schema
    )
    op.create_table(
        "sqla_jobs_queue",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("paused_at", tstz, nullable=True),
        sa.Column("updated_at", tstz, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("queue", name=op.f("sqla_jobs_queue_pkey")),
        schema=schema,
    )


def downgrade() -> None:
    schema = migration_schema()
    table = "sqla_jobs_job" if schema is None else f'"{schema}".sqla_jobs_job'
    op.drop_table("sqla_jobs_queue", schema=schema)
    op.drop_index(op.f("sqla_jobs_history_finished_idx"), "sqla_jobs_history", schema=schema)
    for name in ("meta", "steps", "errors", "last_error", "outcome"):
        op.drop_column("sqla_jobs_history", name, schema=schema)
    op.drop_index(op.f("sqla_jobs_job_finished_idx"), "sqla_jobs_job", schema=schema)
    # Cancelled jobs have no state in the older schema: they would never run, so they go.
    op.execute(f"DELETE FROM {table} WHERE state = 'cancelled'")
    _state_check(schema, _STATES_BEFORE)
    for name in ("errors", "meta", "finished_at", "cancel_requested_at"):
        op.drop_column("sqla_jobs_job", name, schema=schema)
