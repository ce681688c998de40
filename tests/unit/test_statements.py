"""Every statement builder, compiled for PostgreSQL, matches its checked-in ``tests/sql/<name>.sql``.

A change to the SQL is then a plain diff in review. After an intended change, regenerate the files
with ``SQLA_JOBS_UPDATE_SQL=1 pytest tests/unit/test_statements.py`` and review the diff.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.dialects.postgresql import psycopg
from sqlalchemy.sql.compiler import Compiled
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.sql.expression import Executable

from sqla_jobs.model import STATES
from sqla_jobs.sql import statements

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
UPDATE = os.environ.get("SQLA_JOBS_UPDATE_SQL") == "1"

#: The builders that exist today; discovery must find at least these.
KNOWN = {
    "insert_job",
    "insert_jobs",
    "reserve_job_ids",
    "copy_jobs",
    "notify",
    "claim",
    "complete",
    "complete_into_history",
    "fail",
    "heartbeat",
    "release",
    "reap",
    "stats_by_queue",
    "table_health",
    "oldest_transaction",
    "find_job_tables",
    "list_jobs",
    "list_jobs_page",
    "list_queue_states",
    "stats_by_kind",
    "prune_jobs",
    "count_prunable_jobs",
    "prune_history",
    "count_prunable_history",
    "try_lock_pruner",
    "unlock_pruner",
}


def discover_builders() -> dict[str, Callable[[], ClauseElement]]:
    """Every public function defined in ``statements`` that builds a statement when called."""
    found: dict[str, Callable[[], ClauseElement]] = {}
    for name, fn in inspect.getmembers(statements, inspect.isfunction):
        if name.startswith("_") or fn.__module__ != statements.__name__:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = fn()
        except Exception:
            # A builder that cannot build is still a builder: its tests report the error, rather
            # than the whole module failing to collect.
            found[name] = fn
            continue
        if isinstance(built, Executable) and isinstance(built, ClauseElement):
            found[name] = fn
    return found


BUILDERS = discover_builders()


def compile_pg(stmt: ClauseElement) -> Compiled:
    return stmt.compile(dialect=psycopg.dialect())  # type: ignore[no-untyped-call]


def normalised(sql: str) -> str:
    return sql.rstrip("\n") + "\n"


def test_discovery_finds_every_known_builder() -> None:
    assert set(BUILDERS) >= KNOWN


def test_every_sql_file_belongs_to_a_builder() -> None:
    stale = {p.stem for p in SQL_DIR.glob("*.sql")} - set(BUILDERS)
    assert not stale, f"tests/sql has files for builders that no longer exist: {sorted(stale)}"


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_compiled_sql_matches_the_checked_in_file(name: str) -> None:
    sql = normalised(str(compile_pg(BUILDERS[name]())))
    path = SQL_DIR / f"{name}.sql"
    if UPDATE:
        path.write_text(sql, encoding="utf-8")
    assert path.is_file(), (
        f"no golden file {path.relative_to(SQL_DIR.parent.parent)} for statements.{name}(); "
        "create it with SQLA_JOBS_UPDATE_SQL=1 pytest tests/unit/test_statements.py"
    )
    assert normalised(path.read_text(encoding="utf-8")) == sql, (
        f"statements.{name}() no longer compiles to tests/sql/{name}.sql; if the change is "
        "intended, regenerate with SQLA_JOBS_UPDATE_SQL=1 and review the diff"
    )


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_builder_documents_itself(name: str) -> None:
    doc = inspect.getdoc(BUILDERS[name])
    assert doc, f"statements.{name}() has no docstring"


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builders_are_pure_and_compile_to_the_same_sql_every_time(name: str) -> None:
    assert str(compile_pg(BUILDERS[name]())) == str(compile_pg(BUILDERS[name]()))


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        # The claim's selection must imply the partial claim index's predicate.
        (
            "claim",
            [
                "sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NULL",
                "SET state='running'",
            ],
        ),
        (
            "lock_keys",
            ["sqla_jobs_job.state = 'pending' AND sqla_jobs_job.concurrency_key IS NOT NULL"],
        ),
        ("claim_keyed", ["sqla_jobs_job.state = 'pending'", "sqla_jobs_job.state = 'running'"]),
        # The reaper's selection must match the partial running index's predicate.
        ("reap", ["sqla_jobs_job.state = 'running'", "THEN 'dead' ELSE 'pending' END"]),
        ("fail", ["THEN 'dead' ELSE 'pending' END"]),
        ("release", ["THEN 'cancelled' ELSE 'pending' END"]),
        ("retry_jobs", ["SET state='pending'", "IN ('pending', 'dead', 'cancelled')"]),
        ("cancel_pending", ["SET state='cancelled'", "sqla_jobs_job.state = 'pending'"]),
        ("request_cancel", ["sqla_jobs_job.state = 'running'"]),
        ("stats_by_queue", ["sqla_jobs_job.state = 'pending'"]),
        ("stats_by_kind", ["sqla_jobs_job.state = 'pending'"]),
        # Retention: the finished index's predicate as literals (one outcome is then bound).
        ("prune_jobs", ["sqla_jobs_job.state IN ('completed', 'dead', 'cancelled')"]),
        ("count_prunable_jobs", ["sqla_jobs_job.state IN ('completed', 'dead', 'cancelled')"]),
    ],
)
def test_state_constants_are_sql_literals_not_bound_parameters(
    name: str, fragments: list[str]
) -> None:
    compiled = compile_pg(BUILDERS[name]())
    sql = str(compiled)
    for fragment in fragments:
        assert fragment in sql
    bound_values = {v for v in compiled.params.values() if isinstance(v, str)}
    assert not bound_values & set(STATES), f"a state is a bound parameter in {name}: {sql}"
    # No parameter compares or assigns the state column either (retention binds the one outcome
    # it prunes beside the literal predicate, which is what the partial index needs).
    sql = sql.replace("sqla_jobs_job.state = %(state)s", "")
    assert "state = %(" not in sql
    assert "state=%(" not in sql


def test_find_job_tables_resolves_an_unqualified_name_as_the_queue_statements_do() -> None:
    """Without a schema the wanted table is the one the search_path resolves to (``to_regclass``),
    not the one in ``current_schema()``: the first schema of the search_path need not hold it."""
    sql = str(compile_pg(statements.find_job_tables()))
    assert "to_regclass('sqla_jobs_job')" in sql
    assert "current_schema()" not in sql
    assert "FROM pg_class AS c JOIN pg_namespace AS n" in sql


def test_the_cli_job_listing_never_reads_payloads_or_errors_and_locks_nothing() -> None:
    """``sqla-jobs jobs list`` shows no payload (it may hold personal data) and no tracebacks, and
    an operator's listing must never block a worker's claim."""
    sql = str(compile_pg(statements.list_jobs()))
    selected = sql.split("FROM", 1)[0]
    assert "payload" not in selected
    assert "errors" not in selected
    assert "FOR UPDATE" not in sql
    assert "sqla_jobs_job.meta @> %(meta)s::JSONB" in sql


@pytest.mark.parametrize("name", ["list_jobs", "list_queue_states", "stats_by_kind"])
def test_the_cli_listings_are_reads(name: str) -> None:
    sql = str(compile_pg(BUILDERS[name]()))
    assert sql.startswith("SELECT ")
    assert "FOR UPDATE" not in sql


def test_prune_selects_rows_skip_locked_oldest_first_and_deletes_by_primary_key() -> None:
    for name in ("prune_jobs", "prune_history"):
        sql = str(compile_pg(BUILDERS[name]()))
        assert "FOR UPDATE SKIP LOCKED" in sql, sql
        assert ".finished_at < now() - " in sql, sql
        assert ".finished_at \n LIMIT" in sql, sql
        assert ".id = any(array((SELECT" in sql, sql


def test_the_pruner_lock_is_two_key_in_the_package_namespace_and_never_waits() -> None:
    sql = str(compile_pg(statements.try_lock_pruner()))
    assert f"pg_try_advisory_lock({statements.ADVISORY_NAMESPACE}, hashtext(" in sql


def test_the_sampler_lock_is_two_key_in_the_package_namespace_apart_from_the_pruners() -> None:
    sql = str(compile_pg(statements.try_lock_sampler()))
    assert f"pg_try_advisory_lock({statements.ADVISORY_NAMESPACE}, hashtext(" in sql
    assert f"'{statements.SAMPLE_LOCK_NAME}:'" in sql
    assert statements.SAMPLE_LOCK_NAME != statements.PRUNE_LOCK_NAME


def test_the_queue_sample_is_a_read_that_counts_only_due_pending_jobs() -> None:
    sql = str(compile_pg(statements.sample_queues()))
    assert sql.startswith("WITH RECURSIVE heads")
    assert "FOR UPDATE" not in sql
    # Under each (queue, priority) of the claim index, only the entries already due are read.
    assert "sqla_jobs_job.priority = heads.priority AND sqla_jobs_job.run_at <= now()" in sql
