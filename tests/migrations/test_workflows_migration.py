"""Revision sqla_jobs_0008 (job dependencies): what it adds and what its downgrade removes, the
state CHECK validated after its NOT VALID replacement, and the same functions and triggers from
the migration as from ``create_all``."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

import sqla_jobs
from tests.conftest import alembic_config
from tests.migrations._catalog import connect, rows, sqla_jobs_objects

_TRIGGERS = r"""
    SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
      JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = :schema AND NOT t.tgisinternal AND t.tgname LIKE 'sqla\_jobs%'"""
_FUNCTIONS = r"""
    SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = :schema AND p.proname LIKE 'sqla\_jobs%'"""


def test_0008_adds_the_workflow_objects_and_its_downgrade_removes_only_those(
    scratch_url: str,
) -> None:
    cfg = alembic_config(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0007")
    before = sqla_jobs_objects(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0008")
    added = sqla_jobs_objects(scratch_url) - before
    assert {name for kind, name in added if kind == "class"} >= {
        "public.sqla_jobs_dependency",
        "public.sqla_jobs_outcome",
        "public.sqla_jobs_dependency_child_id_idx",
        "public.sqla_jobs_outcome_unsettled_idx",
    }
    with connect(scratch_url) as conn:
        (validated,) = conn.execute(
            text(
                "SELECT convalidated FROM pg_constraint WHERE conname = 'sqla_jobs_job_state_check'"
            )
        ).one()
        assert validated
        conn.execute(
            text("INSERT INTO sqla_jobs_job (kind, payload, state) VALUES ('k', '{}', 'waiting')")
        )
        assert len(rows(conn, _TRIGGERS, schema="public")) == 5
        assert len(rows(conn, _FUNCTIONS, schema="public")) == 4

    command.downgrade(cfg, "sqla_jobs_0007")
    assert sqla_jobs_objects(scratch_url) == before
    with connect(scratch_url) as conn:
        assert conn.execute(text("SELECT state FROM sqla_jobs_job")).scalars().all() == ["pending"]
        assert rows(conn, _TRIGGERS, schema="public") == set()
        assert rows(conn, _FUNCTIONS, schema="public") == set()
    command.upgrade(cfg, "sqla_jobs_0008")
    assert sqla_jobs_objects(scratch_url) - before == added


def test_create_all_makes_the_same_triggers_and_functions_as_the_migration(
    scratch_url: str,
) -> None:
    command.upgrade(alembic_config(scratch_url), "head")
    with connect(scratch_url) as conn:
        conn.execute(text("CREATE SCHEMA model_copy"))
        sqla_jobs.metadata.create_all(
            conn.execution_options(schema_translate_map={None: "model_copy"})
        )
        for query in (_TRIGGERS, _FUNCTIONS):
            # Definitions name the table with its schema, the function only off the search_path.
            migrated, model = (
                {
                    tuple(v.replace(f"{schema}.", "") for v in row)
                    for row in rows(conn, query, schema=schema)
                }
                for schema in ("public", "model_copy")
            )
            assert model == migrated
            assert migrated
