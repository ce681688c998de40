"""The shipped Alembic revisions: what they create and remove, that they match the model, and the
recipe of docs/migrations.md for users who run them from their own Alembic environment.

Every test that needs a database creates its own and drops it. The user-environment tests run
``python -m alembic`` in subprocesses inside a project built in ``tmp_path``, as a user would.
"""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, event, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex

import sqla_jobs
from sqla_jobs.db.urls import sqlalchemy_url
from tests.conftest import alembic_config
from tests.migrations._catalog import (
    OWN_VERSIONS,
    SHARED_VERSIONS,
    Rows,
    catalog,
    connect,
    constraint_names,
    sqla_jobs_objects,
    tables,
    version_rows,
)
from tests.migrations._user_project import (
    OUR_CONSTRAINTS,
    USER_CONVENTION,
    alembic,
    autogenerate,
    discard_revision,
    make_user_project,
    set_target_metadata,
    skip_sqla_jobs_tables,
)

SCHEMA = "jobsschema"
#: The model's tables are built here (``create_all``) to be compared with the migrated ones.
MODEL_COPY = "model_copy"
#: Nothing listens here: a command that tried to connect would fail.
UNREACHABLE_URL = "postgresql://nobody@127.0.0.1:1/nowhere"
#: The newest shipped revision.
HEAD = "sqla_jobs_0010"


def migrated_and_model_catalogs(url: str) -> tuple[dict[str, Rows], dict[str, Rows]]:
    """Upgrade ``url`` to head, build the model with ``create_all`` in another schema; return both
    catalogs (migrated, model)."""
    command.upgrade(alembic_config(url), "head")
    with connect(url) as conn:
        conn.execute(text(f"CREATE SCHEMA {MODEL_COPY}"))
        sqla_jobs.metadata.create_all(
            conn.execution_options(schema_translate_map={None: MODEL_COPY})
        )
        return catalog(conn, "public"), catalog(conn, MODEL_COPY)


# ---------------------------------------------------------------------------------------------
# 1. upgrade / downgrade in the repository's own environment
# ---------------------------------------------------------------------------------------------


def test_upgrade_head_creates_tables_partial_indexes_checks_and_storage_parameters(
    scratch_url: str,
) -> None:
    command.upgrade(alembic_config(scratch_url), "head")

    with connect(scratch_url) as conn:
        found = catalog(conn, "public")
    assert {name for name, kind in found["relations"] if kind == "r"} == {
        "sqla_jobs_job",
        "sqla_jobs_history",
        "sqla_jobs_queue",
        "sqla_jobs_schedule",
        "sqla_jobs_worker",
        "sqla_jobs_throughput",
        "sqla_jobs_dependency",
        "sqla_jobs_outcome",
        "sqla_jobs_rate_limiter",
    }
    indexes = {name: definition for _, name, definition in found["indexes"]}
    # Unique jobs: one job per key among those in a state that counts for it, nothing else.
    unique = indexes["sqla_jobs_job_unique_idx"]
    assert unique.startswith("CREATE UNIQUE INDEX sqla_jobs_job_unique_idx ON sqla_jobs_job")
    assert "(unique_key IS NOT NULL) AND (state = ANY (unique_states))" in unique
    assert indexes["sqla_jobs_schedule_pkey"].startswith("CREATE UNIQUE INDEX")
    # Partial: the claim index holds only pending rows, the running index only running ones.
    # (Their exact columns are the model's; test_model_and_migrations_... compares them.)
    for name, predicate in (("claim", "pending"), ("running", "running")):
        table, _, where = indexes[f"sqla_jobs_job_{name}_idx"].partition(" WHERE ")
        assert table.startswith(f"CREATE INDEX sqla_jobs_job_{name}_idx ON sqla_jobs_job USING")
        assert f"(state = '{predicate}'::text)" in where
    assert indexes["sqla_jobs_job_pkey"].startswith("CREATE UNIQUE INDEX")
    assert indexes["sqla_jobs_history_pkey"].startswith("CREATE UNIQUE INDEX")
    checks = {name: d for _, name, kind, d in found["constraints"] if kind == "c"}
    assert set(checks) >= {
        f"sqla_jobs_job_{name}_check"
        for name in ("state", "lease", "counters", "budgets", "last_error", "queue", "unique")
    }
    assert "ARRAY['pending'::text, 'running'::text]" in checks["sqla_jobs_job_unique_check"]
    assert "'pending'::text, 'running'::text, 'dead'::text" in checks["sqla_jobs_job_state_check"]
    assert "char_length(last_error) <= 500" in checks["sqla_jobs_job_last_error_check"]
    storage = dict(found["storage"])
    for option in (
        "fillfactor=70",
        "autovacuum_vacuum_scale_factor=0.02",
        "autovacuum_vacuum_threshold=200",
        "autovacuum_vacuum_insert_scale_factor=0.05",
        "autovacuum_analyze_scale_factor=0.05",
        "autovacuum_vacuum_cost_limit=2000",
        "autovacuum_vacuum_cost_delay=1",
    ):
        assert option in storage["sqla_jobs_job"]
    assert storage["sqla_jobs_history"] is None
    assert version_rows(scratch_url) == {HEAD}


def test_downgrade_base_removes_every_sqla_jobs_object_and_upgrade_works_again(
    scratch_url: str,
) -> None:
    cfg = alembic_config(scratch_url)
    command.upgrade(cfg, "head")
    created = sqla_jobs_objects(scratch_url)
    assert ("class", "public.sqla_jobs_job_claim_idx") in created

    command.downgrade(cfg, "base")

    assert sqla_jobs_objects(scratch_url) == set()
    assert version_rows(scratch_url) == set()
    command.upgrade(cfg, "head")
    assert sqla_jobs_objects(scratch_url) == created


def test_0006_adds_only_the_worker_registry_and_its_downgrade_removes_only_that(
    scratch_url: str,
) -> None:
    """0005 -> 0006 -> 0005 -> 0006: the registry table (and its primary key) comes and goes, a
    worker's row with it; nothing else in the database changes."""
    cfg = alembic_config(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0005")
    before = sqla_jobs_objects(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0006")
    added = sqla_jobs_objects(scratch_url) - before
    assert added == {
        ("class", "public.sqla_jobs_worker"),
        ("class", "public.sqla_jobs_worker_pkey"),
        ("constraint", "public.sqla_jobs_worker_pkey"),
        ("type", "public.sqla_jobs_worker"),
    }
    assert sqla_jobs_objects(scratch_url) >= before
    with connect(scratch_url) as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_worker (name, host, pid, queues, concurrency, expires_at) "
                "VALUES ('w', 'h', 1, '{default}', 4, now() + interval '1 minute')"
            )
        )
        row = conn.execute(text("SELECT started_at, heartbeat_at FROM sqla_jobs_worker")).one()
        assert row.started_at == row.heartbeat_at  # both default to now()

    command.downgrade(cfg, "sqla_jobs_0005")
    assert sqla_jobs_objects(scratch_url) == before
    assert version_rows(scratch_url) == {"sqla_jobs_0005"}
    command.upgrade(cfg, "sqla_jobs_0006")
    assert sqla_jobs_objects(scratch_url) - before == added
    assert version_rows(scratch_url) == {"sqla_jobs_0006"}


def test_0007_adds_only_the_throughput_table_and_its_downgrade_removes_only_that(
    scratch_url: str,
) -> None:
    """0006 -> 0007 -> 0006 -> 0007: the per-minute throughput table (and its primary key) comes
    and goes; nothing else in the database changes, and its counters default to zero."""
    cfg = alembic_config(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0006")
    before = sqla_jobs_objects(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0007")
    added = sqla_jobs_objects(scratch_url) - before
    assert added == {
        ("class", "public.sqla_jobs_throughput"),
        ("class", "public.sqla_jobs_throughput_pkey"),
        ("constraint", "public.sqla_jobs_throughput_pkey"),
        ("type", "public.sqla_jobs_throughput"),
    }
    with connect(scratch_url) as conn:
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_throughput (minute, queue, kind, completed) "
                "VALUES (date_trunc('minute', now()), 'q', 'k', 1)"
            )
        )
        row = conn.execute(text("SELECT failed, runs, run_seconds FROM sqla_jobs_throughput")).one()
        assert tuple(row) == (0, 0, 0.0)

    command.downgrade(cfg, "sqla_jobs_0006")
    assert sqla_jobs_objects(scratch_url) == before
    assert version_rows(scratch_url) == {"sqla_jobs_0006"}
    command.upgrade(cfg, "sqla_jobs_0007")
    assert sqla_jobs_objects(scratch_url) - before == added
    assert version_rows(scratch_url) == {"sqla_jobs_0007"}


def _job_indexes(url: str) -> dict[str, str]:
    with connect(url) as conn:
        rows = conn.execute(
            text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'sqla_jobs_job'")
        )
        return {name: definition for name, definition in rows}


def test_0009_keeps_rate_limited_jobs_out_of_the_claim_indexes_and_its_downgrade_undoes_it(
    scratch_url: str,
) -> None:
    """0008 -> 0009 -> 0008 -> 0009: the rate limiter table, the job's rate_key, the rated index;
    the claim and keyed indexes rebuilt under their own names without rate limited jobs, and back;
    a pending job survives both ways."""
    cfg = alembic_config(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0008")
    before = sqla_jobs_objects(scratch_url)
    old_indexes = _job_indexes(scratch_url)
    with connect(scratch_url) as conn:
        conn.execute(text("INSERT INTO sqla_jobs_job (kind, payload) VALUES ('k', '{}')"))
    command.upgrade(cfg, "sqla_jobs_0009")
    assert sqla_jobs_objects(scratch_url) - before == {
        ("class", "public.sqla_jobs_rate_limiter"),
        ("class", "public.sqla_jobs_rate_limiter_pkey"),
        ("constraint", "public.sqla_jobs_rate_limiter_pkey"),
        ("type", "public.sqla_jobs_rate_limiter"),
        ("class", "public.sqla_jobs_job_rated_idx"),
    }
    indexes = _job_indexes(scratch_url)
    for name in ("claim", "keyed"):
        assert "(rate_key IS NULL)" in indexes[f"sqla_jobs_job_{name}_idx"]
    assert "(rate_key IS NOT NULL)" in indexes["sqla_jobs_job_rated_idx"]
    command.downgrade(cfg, "sqla_jobs_0008")
    assert sqla_jobs_objects(scratch_url) == before
    assert _job_indexes(scratch_url) == old_indexes
    with connect(scratch_url) as conn:
        assert conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar_one() == 1
    command.upgrade(cfg, "head")
    assert version_rows(scratch_url) == {HEAD}


def test_upgrade_head_a_second_time_is_a_noop_that_executes_no_ddl(scratch_url: str) -> None:
    command.upgrade(alembic_config(scratch_url), "head")
    with connect(scratch_url) as conn:
        before = catalog(conn, "public")
    executed: list[str] = []

    engine = create_engine(sqlalchemy_url(scratch_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            event.listen(
                conn, "before_cursor_execute", lambda *a: executed.append(a[2].lstrip().upper())
            )
            cfg = alembic_config(scratch_url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
    finally:
        engine.dispose()

    assert executed, "the listener saw alembic's version query"
    assert [s for s in executed if not s.startswith("SELECT")] == []
    with connect(scratch_url) as conn:
        assert catalog(conn, "public") == before
    assert version_rows(scratch_url) == {HEAD}


# ---------------------------------------------------------------------------------------------
# 2. the model and the migrations describe the same schema
# ---------------------------------------------------------------------------------------------


def test_autogenerate_finds_no_difference_between_model_and_migrations(scratch_url: str) -> None:
    command.upgrade(alembic_config(scratch_url), "head")

    with connect(scratch_url) as conn:
        # Autogenerate leaves out the version table of the context, as in a real environment.
        context = MigrationContext.configure(conn, opts={"version_table": OWN_VERSIONS})
        diff = compare_metadata(context, sqla_jobs.metadata)

    assert diff == []


def test_partial_index_predicates_of_model_and_migrations_are_equal(scratch_url: str) -> None:
    """compare_metadata does not look at predicates, so PostgreSQL renders both: the migrated
    indexes, and the model's CreateIndex DDL run by create_all in another schema."""
    migrated, model = migrated_and_model_catalogs(scratch_url)
    migrated_defs = {name: definition for _, name, definition in migrated["indexes"]}
    model_defs = {name: definition for _, name, definition in model["indexes"]}
    dialect = postgresql.dialect()
    partial = [
        ix
        for ix in sqla_jobs.Job.__table__.indexes
        if ix.dialect_options["postgresql"]["where"] is not None
    ]
    assert {ix.name for ix in partial} >= {"sqla_jobs_job_claim_idx", "sqla_jobs_job_running_idx"}

    for ix in partial:
        predicate = ix.dialect_options["postgresql"]["where"].compile(dialect=dialect)
        assert str(CreateIndex(ix).compile(dialect=dialect)).endswith(f" WHERE {predicate}")
        assert " WHERE " in migrated_defs[str(ix.name)]
        assert migrated_defs[str(ix.name)] == model_defs[str(ix.name)]
    assert migrated_defs == model_defs


def test_model_and_migrations_produce_the_same_columns_constraints_and_indexes(
    scratch_url: str,
) -> None:
    migrated, model = migrated_and_model_catalogs(scratch_url)

    for part in ("columns", "constraints", "indexes", "relations"):
        assert migrated[part] == model[part], part


def test_0002_leaves_room_on_each_page_of_a_table_that_already_holds_jobs(
    scratch_url: str,
) -> None:
    cfg = alembic_config(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0001")
    with connect(scratch_url) as conn:
        conn.execute(text("INSERT INTO sqla_jobs_job (kind, payload) VALUES ('k', '{}')"))

    def storage() -> str:
        with connect(scratch_url) as conn:
            return str(dict(catalog(conn, "public")["storage"])["sqla_jobs_job"])

    assert "fillfactor" not in storage()
    command.upgrade(cfg, "head")
    assert "fillfactor=70" in storage()
    assert "autovacuum_vacuum_scale_factor=0.02" in storage()
    with connect(scratch_url) as conn:
        assert conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar() == 1
    command.downgrade(cfg, "sqla_jobs_0001")
    assert "fillfactor" not in storage()
    assert "autovacuum_vacuum_scale_factor=0.02" in storage()
    assert version_rows(scratch_url) == {"sqla_jobs_0001"}


def test_model_declares_the_storage_parameters_the_migration_sets(scratch_url: str) -> None:
    migrated, model = migrated_and_model_catalogs(scratch_url)

    assert migrated["storage"] == model["storage"]


# ---------------------------------------------------------------------------------------------
# 3. offline mode (--sql)
# ---------------------------------------------------------------------------------------------


def render_sql(*x: str) -> str:
    """``alembic [-x ...] upgrade head --sql`` against a URL nobody listens on."""
    cfg = alembic_config(UNREACHABLE_URL)
    cfg.output_buffer = io.StringIO()
    if x:
        cfg.cmd_opts = argparse.Namespace(x=list(x))
    command.upgrade(cfg, "head", sql=True)
    return cfg.output_buffer.getvalue()


def test_upgrade_sql_renders_plain_ddl_without_connecting() -> None:
    sql = render_sql()

    assert "CREATE TABLE sqla_jobs_job (" in sql
    assert "CREATE TABLE sqla_jobs_history (" in sql
    assert re.search(
        r"^CREATE INDEX sqla_jobs_job_claim_idx ON sqla_jobs_job \([a-z_, ]+\) "
        r"WHERE state = 'pending'",
        sql,
        re.MULTILINE,
    )
    assert "ALTER TABLE sqla_jobs_job SET (autovacuum_vacuum_scale_factor = 0.02" in sql
    assert "INSERT INTO sqla_jobs_alembic_version (version_num) VALUES ('sqla_jobs_0001')" in sql
    assert "ALTER TABLE sqla_jobs_job SET (fillfactor = 70)" in sql
    assert f"UPDATE sqla_jobs_alembic_version SET version_num='{HEAD}'" in sql


def test_rendered_sql_applied_by_hand_builds_the_same_schema_as_online_upgrade(
    scratch_url: str,
) -> None:
    command.upgrade(alembic_config(scratch_url), "head")
    with connect(scratch_url) as conn:
        online = catalog(conn, "public")
        conn.execute(text("CREATE SCHEMA by_hand"))
        conn.exec_driver_sql("SET search_path TO by_hand")
        conn.exec_driver_sql(render_sql())
        assert catalog(conn, "by_hand") == online


def test_schema_option_refuses_a_name_that_is_not_a_plain_identifier() -> None:
    with pytest.raises(ValueError, match="invalid sqla_jobs_schema 'a; DROP TABLE x'"):
        render_sql("sqla_jobs_schema=a; DROP TABLE x")


def test_sql_rendered_for_a_schema_leaves_the_database_where_online_upgrade_expects_it(
    scratch_url: str,
) -> None:
    """The rendered script keeps the version table in the chosen schema, as online mode does, so
    a later online upgrade sees it as applied instead of creating the tables again."""
    with connect(scratch_url) as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        conn.exec_driver_sql(render_sql(f"sqla_jobs_schema={SCHEMA}"))
    cfg = alembic_config(scratch_url)
    cfg.cmd_opts = argparse.Namespace(x=[f"sqla_jobs_schema={SCHEMA}"])

    command.upgrade(cfg, "head")

    assert version_rows(scratch_url, SCHEMA) == {HEAD}


# ---------------------------------------------------------------------------------------------
# 4. -x sqla_jobs_schema
# ---------------------------------------------------------------------------------------------


def test_schema_option_puts_every_object_in_that_schema_and_downgrade_removes_them(
    scratch_url: str,
) -> None:
    with connect(scratch_url) as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    cfg = alembic_config(scratch_url)
    cfg.cmd_opts = argparse.Namespace(x=[f"sqla_jobs_schema={SCHEMA}"])

    command.upgrade(cfg, "head")

    objects = sqla_jobs_objects(scratch_url)
    assert {name.split(".")[0] for _, name in objects} == {SCHEMA}
    assert {f"{SCHEMA}.sqla_jobs_job", f"{SCHEMA}.sqla_jobs_job_claim_idx"} <= {
        name for _, name in objects
    }
    assert tables(scratch_url) == {
        f"{SCHEMA}.sqla_jobs_job",
        f"{SCHEMA}.sqla_jobs_history",
        f"{SCHEMA}.sqla_jobs_queue",
        f"{SCHEMA}.sqla_jobs_schedule",
        f"{SCHEMA}.sqla_jobs_worker",
        f"{SCHEMA}.sqla_jobs_throughput",
        f"{SCHEMA}.sqla_jobs_dependency",
        f"{SCHEMA}.sqla_jobs_outcome",
        f"{SCHEMA}.sqla_jobs_rate_limiter",
        f"{SCHEMA}.sqla_jobs_alembic_version",
    }
    with connect(scratch_url) as conn:
        storage = dict(catalog(conn, SCHEMA)["storage"])
    assert "autovacuum_vacuum_scale_factor=0.02" in storage["sqla_jobs_job"]

    command.downgrade(cfg, "base")

    assert sqla_jobs_objects(scratch_url) == set()
    assert tables(scratch_url) == {f"{SCHEMA}.sqla_jobs_alembic_version"}


# ---------------------------------------------------------------------------------------------
# 5. a user's own Alembic environment: the recipe of docs/migrations.md
# ---------------------------------------------------------------------------------------------


def test_user_recipe_upgrades_heads_autogenerates_nothing_and_downgrades_only_sqla_jobs(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    ini = make_user_project(init_output, tmp_path, scratch_url)

    # Two bases, so two heads: "head" is ambiguous, "heads" upgrades both branches.
    refused = alembic(ini, "upgrade", "head", ok=False)
    assert "Multiple head revisions" in refused.stdout + refused.stderr
    alembic(ini, "upgrade", "heads")

    assert tables(scratch_url) == {
        "public.invoice",
        "public.sqla_jobs_job",
        "public.sqla_jobs_history",
        "public.sqla_jobs_queue",
        "public.sqla_jobs_schedule",
        "public.sqla_jobs_worker",
        "public.sqla_jobs_throughput",
        "public.sqla_jobs_dependency",
        "public.sqla_jobs_outcome",
        "public.sqla_jobs_rate_limiter",
        "public.alembic_version",
    }
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"myapp_0001", HEAD}
    names = constraint_names(scratch_url)
    assert names >= OUR_CONSTRAINTS
    assert names >= {"pk_invoice", "ck_invoice_amount_not_negative"}
    # With a list as target_metadata Alembic applies no naming convention to op.* calls: a bare
    # name in the user's own revision stays bare (docs: "Naming conventions").
    assert "customer_not_empty" in names

    # alembic check compares all heads; a new revision must name the head it extends.
    assert "No new upgrade operations detected" in alembic(ini, "check").stdout
    refused = alembic(ini, "revision", "-m", "x", ok=False)
    assert "Multiple heads are present" in refused.stdout + refused.stderr
    assert autogenerate(ini, "check") == {"upgrade": "pass", "downgrade": "pass"}

    sql = alembic(ini, "upgrade", "sqla_jobs@head", "--sql").stdout
    assert "CREATE TABLE sqla_jobs_job (" in sql
    assert "CREATE INDEX sqla_jobs_job_claim_idx ON sqla_jobs_job" in sql
    assert "WHERE state = 'pending'" in sql
    assert "invoice" not in sql

    alembic(ini, "downgrade", "sqla_jobs@base")

    assert sqla_jobs_objects(scratch_url) == set()
    assert tables(scratch_url) == {"public.invoice", "public.alembic_version"}
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"myapp_0001"}


def test_without_sqla_jobs_metadata_in_target_metadata_autogenerate_would_drop_the_job_table(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    """Why the recipe lists sqla_jobs.metadata: without it our tables are tables nobody declared,
    and autogenerate proposes to drop them."""
    ini = make_user_project(init_output, tmp_path, scratch_url, target_metadata="Base.metadata")
    alembic(ini, "upgrade", "heads")

    # A single MetaData as target: Alembic applies its naming convention to every op.* call, the
    # shipped revision's included; op.f() keeps our names exactly as written.
    names = constraint_names(scratch_url)
    assert names >= OUR_CONSTRAINTS
    assert not [n for n in names if n.startswith(("ck_sqla_jobs", "pk_sqla_jobs"))]
    assert "ck_invoice_customer_not_empty" in names

    failed = alembic(ini, "check", ok=False)
    assert "remove_table" in failed.stdout + failed.stderr
    upgrade = autogenerate(ini, "nometadata")["upgrade"]

    assert "op.drop_table('sqla_jobs_job')" in upgrade
    assert "op.drop_index(op.f('sqla_jobs_job_claim_idx')" in upgrade
    assert "op.drop_table('sqla_jobs_history')" in upgrade
    assert "invoice" not in upgrade


def test_one_metadata_with_an_include_name_hook_keeps_the_users_convention_and_sees_no_change(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    """The alternative for a project whose revisions rely on its naming convention: keep a single
    MetaData (the convention still applies) and hide sqla-jobs' tables from autogenerate."""
    ini = make_user_project(init_output, tmp_path, scratch_url, target_metadata="Base.metadata")
    skip_sqla_jobs_tables(ini)
    alembic(ini, "upgrade", "heads")

    assert "ck_invoice_customer_not_empty" in constraint_names(scratch_url)
    assert "No new upgrade operations detected" in alembic(ini, "check").stdout


def test_user_recipe_with_sqla_jobs_schema_in_alembic_ini_keeps_our_tables_in_that_schema(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    """sqla_jobs_schema in alembic.ini applies to every command. Autogenerate reflects only the
    default schema, so with a schema target_metadata must leave sqla_jobs.metadata out."""
    with connect(scratch_url) as conn:
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    ini = make_user_project(
        init_output, tmp_path, scratch_url, extra_ini=f"sqla_jobs_schema = {SCHEMA}\n"
    )
    alembic(ini, "upgrade", "heads")

    assert tables(scratch_url) == {
        "public.invoice",
        "public.alembic_version",
        f"{SCHEMA}.sqla_jobs_job",
        f"{SCHEMA}.sqla_jobs_history",
        f"{SCHEMA}.sqla_jobs_queue",
        f"{SCHEMA}.sqla_jobs_schedule",
        f"{SCHEMA}.sqla_jobs_worker",
        f"{SCHEMA}.sqla_jobs_throughput",
        f"{SCHEMA}.sqla_jobs_dependency",
        f"{SCHEMA}.sqla_jobs_outcome",
        f"{SCHEMA}.sqla_jobs_rate_limiter",
    }
    # Listed, the schema-less sqla_jobs tables look missing from the default schema.
    assert "op.create_table('sqla_jobs_job'" in autogenerate(ini, "listed")["upgrade"]
    discard_revision(ini, "listed")
    set_target_metadata(ini, "Base.metadata")
    assert autogenerate(ini, "check") == {"upgrade": "pass", "downgrade": "pass"}

    alembic(ini, "downgrade", "sqla_jobs@base")

    assert sqla_jobs_objects(scratch_url) == set()
    assert tables(scratch_url) == {"public.invoice", "public.alembic_version"}


def test_path_separator_space_loses_the_users_revisions_when_the_path_has_a_space(
    init_output: Path, tmp_path: Path
) -> None:
    """``%(here)s`` is split at the space, silently: use ``path_separator = newline`` there."""
    spaced = make_user_project(init_output, tmp_path / "my project", UNREACHABLE_URL)
    newline = make_user_project(
        init_output, tmp_path / "my other project", UNREACHABLE_URL, separator="newline"
    )

    assert "myapp_0001" not in alembic(spaced, "heads").stdout
    heads = alembic(newline, "heads").stdout
    assert "myapp_0001 (myapp) (head)" in heads
    assert f"{HEAD} (sqla_jobs) (head)" in heads


def test_downgrade_keeps_index_names_under_a_host_convention_naming_indexes_by_constraint_name(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    convention = {**USER_CONVENTION, "ix": "ix_%(table_name)s_%(constraint_name)s"}
    ini = make_user_project(
        init_output, tmp_path, scratch_url, target_metadata="Base.metadata", convention=convention
    )
    alembic(ini, "upgrade", "heads")

    alembic(ini, "downgrade", "sqla_jobs@base")

    assert sqla_jobs_objects(scratch_url) == set()
