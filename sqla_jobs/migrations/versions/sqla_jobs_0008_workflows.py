"""sqla-jobs: job dependencies. The ``waiting`` state; a parent count on the waiting child and a
marker on a parent that has dependents; the edges and the outcomes of finished parents; the
triggers that release or cancel children in the transaction that ends their parent.

The new columns are nullable without a default: no rewrite. The state CHECK is replaced ``NOT
VALID`` (a brief lock, no scan) and then validated, which scans the table without blocking
writes. A worker of an earlier version never claims a waiting job: its claim takes only
``pending`` rows.

Revision ID: sqla_jobs_0008
Revises: sqla_jobs_0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sqla_jobs.migrations.schema import migration_schema
from sqla_jobs.model.workflows import FUNCTIONS, workflow_ddl

revision = "sqla_jobs_0008"
down_revision = "sqla_jobs_0007"
branch_labels = None
depends_on = None

_STATES_BEFORE = "state IN ('pending', 'running', 'dead', 'completed', 'cancelled')"
_STATES = "state IN ('pending', 'running', 'dead', 'completed', 'cancelled', 'waiting')"


def _state_check(schema: str | None, condition: str) -> None:
    table = "sqla_jobs_job" if schema is None else f'"{schema}".sqla_jobs_job'
    name = op.f("sqla_jobs_job_state_check")
    op.execute(
        f"ALTER TABLE {table} DROP CONSTRAINT {name},"
        f" ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID"
    )
    op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def upgrade() -> None:
    schema = migration_schema()
    op.add_column("sqla_jobs_job", sa.Column("waiting_on", sa.Integer()), schema=schema)
    op.add_column("sqla_jobs_job", sa.Column("has_dependents", sa.Boolean()), schema=schema)
    _state_check(schema, _STATES)
    op.create_table(
        "sqla_jobs_dependency",
        sa.Column("parent_id", sa.BigInteger(), nullable=False),
        sa.Column("child_id", sa.BigInteger(), nullable=False),
        sa.Column("run_anyway", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint(
            "parent_id", "child_id", name=op.f("sqla_jobs_dependency_pkey")
        ),
        schema=schema,
    )
    op.create_index(
        op.f("sqla_jobs_dependency_child_id_idx"),
        "sqla_jobs_dependency",
        ["child_id"],
        schema=schema,
    )
    op.create_table(
        "sqla_jobs_outcome",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column(
            "finished_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("unsettled", sa.Boolean()),
        sa.PrimaryKeyConstraint("id", name=op.f("sqla_jobs_outcome_pkey")),
        schema=schema,
    )
    op.create_index(
        op.f("sqla_jobs_outcome_finished_at_idx"), "sqla_jobs_outcome", ["finished_at"], schema=schema
    )
    op.create_index(
        op.f("sqla_jobs_outcome_unsettled_idx"),
        "sqla_jobs_outcome",
        ["id"],
        postgresql_where=sa.text("unsettled"),
        schema=schema,
    )
    for statement in workflow_ddl(schema):
        op.execute(statement)


def downgrade() -> None:
    schema = migration_schema()
    q = "" if schema is None else f'"{schema}".'
    # Waiting jobs have no state before this revision: they become pending (they run at once).
    op.execute(f"UPDATE {q}sqla_jobs_job SET state = 'pending' WHERE state = 'waiting'")
    op.execute(f"DROP TRIGGER sqla_jobs_job_ended ON {q}sqla_jobs_job")
    op.execute(f"DROP TRIGGER sqla_jobs_job_deleted ON {q}sqla_jobs_job")
    op.drop_table("sqla_jobs_outcome", schema=schema)
    op.drop_table("sqla_jobs_dependency", schema=schema)
    for name in FUNCTIONS:
        op.execute(f"DROP FUNCTION {q}{name}()")
    _state_check(schema, _STATES_BEFORE)
    op.drop_column("sqla_jobs_job", "has_dependents", schema=schema)
    op.drop_column("sqla_jobs_job", "waiting_on", schema=schema)
