"""Every statement builder of :mod:`sqla_jobs.sql`, compiled for PostgreSQL, matches its checked-in
``tests/sql/<name>.sql``.

A change to the SQL is then a plain diff in review. After an intended change, regenerate the files
with ``SQLA_JOBS_UPDATE_SQL=1 pytest tests/unit/test_sql_builders.py`` and review the diff.

The builders are found through each module's ``__all__``: :func:`check_builders` fails on a public
function a module leaves out of it (a builder the golden test would never see), on a builder name
two modules export, on a builder without a golden file and on a golden file without a builder.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import literal_column, select
from sqlalchemy.dialects.postgresql import psycopg
from sqlalchemy.sql.compiler import Compiled
from sqlalchemy.sql.elements import ClauseElement, ColumnElement
from sqlalchemy.sql.expression import Executable

import sqla_jobs.sql
from sqla_jobs.model import STATES
from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import listings as listings_sql
from sqla_jobs.sql import maintenance as maintenance_sql
from sqla_jobs.sql import metrics as metrics_sql
from sqla_jobs.sql import tables as tables_sql

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
    "claim_keyed",
    "lock_keys",
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

Builder = Callable[[], ClauseElement]


def sql_modules() -> list[types.ModuleType]:
    """Every module of :mod:`sqla_jobs.sql`, imported."""
    return [
        importlib.import_module(f"{sqla_jobs.sql.__name__}.{info.name}")
        for info in pkgutil.iter_modules(sqla_jobs.sql.__path__)
    ]


def is_builder(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` builds a statement when called with no argument: a Core statement, not a
    column expression (the helpers the builders share return those). A function that needs an
    argument composes builders (``claim_jobs``) and is not one; a builder that raises is still
    a builder, and its tests report the error."""
    required = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = fn()
    except Exception:
        return True
    return (
        isinstance(built, Executable)
        and isinstance(built, ClauseElement)
        and not isinstance(built, ColumnElement)
    )


@dataclass
class Found:
    """The builders of some modules, by name (with the module that exports each), and what is
    wrong with them; no problem means the golden test sees every builder once."""

    builders: dict[str, Builder] = field(default_factory=dict)
    homes: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def check_builders(
    modules: Iterable[types.ModuleType], golden_dir: Path, *, golden: bool = True
) -> Found:
    """Find the builders ``modules`` export in ``__all__`` and report what the golden test would
    miss. ``golden``: also hold the builders against the ``.sql`` files of ``golden_dir``."""
    found = Found()
    for module in modules:
        exported = getattr(module, "__all__", None)
        if exported is None:
            found.problems.append(f"{module.__name__} has no __all__")
            continue
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if (
                fn.__module__ == module.__name__
                and not name.startswith("_")
                and name not in exported
            ):
                found.problems.append(
                    f"{module.__name__}.{name} is public but not in __all__: list it (a builder "
                    "left out is never compared with its golden file) or make it private"
                )
        for name in exported:
            fn = getattr(module, name, None)
            if fn is None:
                found.problems.append(f"{module.__name__}.__all__ names {name}, which it lacks")
                continue
            if not inspect.isfunction(fn) or not is_builder(fn):
                continue
            if name in found.builders:
                found.problems.append(
                    f"builder {name} is exported by both {found.homes[name]} and "
                    f"{module.__name__}: one name, one golden file, one home"
                )
                continue
            found.builders[name] = fn
            found.homes[name] = module.__name__
    if golden:
        files = {p.stem for p in golden_dir.glob("*.sql")}
        for name in sorted(set(found.builders) - files):
            found.problems.append(
                f"builder {found.homes[name]}.{name} has no golden file {name}.sql: create it "
                "with SQLA_JOBS_UPDATE_SQL=1 pytest tests/unit/test_sql_builders.py"
            )
        for name in sorted(files - set(found.builders)):
            found.problems.append(f"golden file {name}.sql has no builder: delete it")
    return found


FOUND = check_builders(sql_modules(), SQL_DIR, golden=not UPDATE)
BUILDERS = FOUND.builders


def compile_pg(stmt: ClauseElement) -> Compiled:
    return stmt.compile(dialect=psycopg.dialect())  # type: ignore[no-untyped-call]


def normalised(sql: str) -> str:
    return sql.rstrip("\n") + "\n"


def test_every_builder_is_found_once_and_has_its_golden_file() -> None:
    assert not FOUND.problems, "\n".join(FOUND.problems)


def test_discovery_finds_every_known_builder() -> None:
    assert set(BUILDERS) >= KNOWN


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_compiled_sql_matches_the_checked_in_file(name: str) -> None:
    sql = normalised(str(compile_pg(BUILDERS[name]())))
    path = SQL_DIR / f"{name}.sql"
    if UPDATE:
        path.write_text(sql, encoding="utf-8")
    assert path.is_file(), (
        f"no golden file {path.relative_to(SQL_DIR.parent.parent)} for {FOUND.homes[name]}.{name}(); "
        "create it with SQLA_JOBS_UPDATE_SQL=1 pytest tests/unit/test_sql_builders.py"
    )
    assert normalised(path.read_text(encoding="utf-8")) == sql, (
        f"{FOUND.homes[name]}.{name}() no longer compiles to tests/sql/{name}.sql; if the change is "
        "intended, regenerate with SQLA_JOBS_UPDATE_SQL=1 and review the diff"
    )


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_builder_documents_itself(name: str) -> None:
    doc = inspect.getdoc(BUILDERS[name])
    assert doc, f"{FOUND.homes[name]}.{name}() has no docstring"


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
        (
            "cancel_pending",
            ["SET state='cancelled'", "sqla_jobs_job.state IN ('pending', 'waiting')"],
        ),
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
    sql = str(compile_pg(catalog_sql.find_job_tables()))
    assert "to_regclass('sqla_jobs_job')" in sql
    assert "current_schema()" not in sql
    assert "FROM pg_class AS c JOIN pg_namespace AS n" in sql


def test_the_cli_job_listing_never_reads_payloads_or_errors_and_locks_nothing() -> None:
    """``sqla-jobs jobs list`` shows no payload (it may hold personal data) and no tracebacks, and
    an operator's listing must never block a worker's claim."""
    sql = str(compile_pg(listings_sql.list_jobs()))
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
    sql = str(compile_pg(maintenance_sql.try_lock_pruner()))
    assert f"pg_try_advisory_lock({tables_sql.ADVISORY_NAMESPACE}, hashtext(" in sql


def test_the_sampler_lock_is_two_key_in_the_package_namespace_apart_from_the_pruners() -> None:
    sql = str(compile_pg(metrics_sql.try_lock_sampler()))
    assert f"pg_try_advisory_lock({tables_sql.ADVISORY_NAMESPACE}, hashtext(" in sql
    assert f"'{metrics_sql.SAMPLE_LOCK_NAME}:'" in sql
    assert metrics_sql.SAMPLE_LOCK_NAME != maintenance_sql.PRUNE_LOCK_NAME


def test_the_queue_sample_is_a_read_that_counts_only_due_pending_jobs() -> None:
    sql = str(compile_pg(metrics_sql.sample_queues()))
    assert sql.startswith("WITH RECURSIVE heads")
    assert "FOR UPDATE" not in sql
    # Under each (queue, priority) of the claim index, only the entries already due are read.
    assert "sqla_jobs_job.priority = heads.priority AND sqla_jobs_job.run_at <= now()" in sql


# -- the checker itself: each failure planted in a fake module, and seen ----------------------------


def _module(name: str, exported: list[str] | None, **functions: Callable[..., Any]) -> Any:
    module = types.ModuleType(name)
    for fn_name, fn in functions.items():
        fn.__module__ = name
        fn.__name__ = fn_name
        setattr(module, fn_name, fn)
    if exported is not None:
        module.__all__ = exported
    return module


def _a_builder() -> Callable[[], ClauseElement]:
    def build() -> ClauseElement:
        """Select one."""
        return select(literal_column("1"))

    return build


def _golden(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / f"{name}.sql").write_text("SELECT 1\n", encoding="utf-8")
    return tmp_path


def test_the_checker_finds_builders_and_no_problem_when_all_is_complete(tmp_path: Path) -> None:
    def helper() -> ColumnElement[Any]:
        """An expression the builders share: listed, but not a builder."""
        return literal_column("1")

    def composer(*, keyed: bool) -> ClauseElement:
        """Builds with an option it must be given: not a builder of its own."""
        return select(literal_column("1"))

    fake = _module(
        "fake.sql.one",
        ["lock_it", "helper", "composer"],
        lock_it=_a_builder(),
        helper=helper,
        composer=composer,
    )
    found = check_builders([fake], _golden(tmp_path, "lock_it"))
    assert found.problems == []
    assert set(found.builders) == {"lock_it"}
    assert found.homes == {"lock_it": "fake.sql.one"}


def test_the_checker_reports_a_public_function_left_out_of_all(tmp_path: Path) -> None:
    fake = _module("fake.sql.one", ["listed"], listed=_a_builder(), forgotten=_a_builder())
    found = check_builders([fake], _golden(tmp_path, "listed", "forgotten"))
    assert any("fake.sql.one.forgotten is public but not in __all__" in p for p in found.problems)
    assert "forgotten" not in found.builders


def test_the_checker_ignores_private_and_imported_functions(tmp_path: Path) -> None:
    fake = _module("fake.sql.one", ["listed"], listed=_a_builder(), _private=_a_builder())
    fake.imported = _a_builder()  # defined elsewhere: its own module lists it
    fake.imported.__module__ = "fake.sql.other"
    assert check_builders([fake], _golden(tmp_path, "listed")).problems == []


def test_the_checker_reports_a_module_without_all(tmp_path: Path) -> None:
    fake = _module("fake.sql.bare", None, build=_a_builder())
    found = check_builders([fake], _golden(tmp_path, "build"))
    assert "fake.sql.bare has no __all__" in found.problems


def test_the_checker_reports_a_builder_two_modules_export(tmp_path: Path) -> None:
    one = _module("fake.sql.one", ["claim"], claim=_a_builder())
    two = _module("fake.sql.two", ["claim"], claim=_a_builder())
    found = check_builders([one, two], _golden(tmp_path, "claim"))
    assert any(
        "builder claim is exported by both fake.sql.one and fake.sql.two" in p
        for p in found.problems
    )


def test_the_checker_reports_a_builder_without_a_golden_file(tmp_path: Path) -> None:
    fake = _module("fake.sql.one", ["listed", "new"], listed=_a_builder(), new=_a_builder())
    found = check_builders([fake], _golden(tmp_path, "listed"))
    assert any("fake.sql.one.new has no golden file new.sql" in p for p in found.problems)


def test_the_checker_reports_a_golden_file_without_a_builder(tmp_path: Path) -> None:
    fake = _module("fake.sql.one", ["listed"], listed=_a_builder())
    found = check_builders([fake], _golden(tmp_path, "listed", "gone"))
    assert found.problems == ["golden file gone.sql has no builder: delete it"]


def test_the_checker_counts_a_builder_that_raises_as_a_builder(tmp_path: Path) -> None:
    def broken() -> ClauseElement:
        """Fails to build: its compile test reports why."""
        raise RuntimeError("no")

    fake = _module("fake.sql.one", ["broken"], broken=broken)
    found = check_builders([fake], _golden(tmp_path))
    assert "broken" in found.builders
    assert any("has no golden file broken.sql" in p for p in found.problems)


def test_every_module_of_the_sql_package_is_checked() -> None:
    names = {m.__name__.rsplit(".", 1)[1] for m in sql_modules()}
    assert {"tables", "enqueue", "claim", "outcomes", "catalog", "compiled"} <= names
