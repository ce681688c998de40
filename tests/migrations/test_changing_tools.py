"""docs/migrations.md, "With sqla-jobs migrate" and "Changing tools": ``sqla-jobs migrate`` beside
an application's own Alembic environment, and a project moving from one tool to the other.
Neither move runs a revision twice or touches the application's revisions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sqla_jobs.cli.entry import main
from tests.conftest import create_database, drop_database
from tests.migrations._catalog import (
    SHARED_VERSIONS,
    execute_sql,
    sqla_jobs_objects,
    tables,
    version_rows,
)
from tests.migrations._documented import DOC, documented
from tests.migrations._revision_files import SHIPPED_HEAD
from tests.migrations._user_project import (
    USER_CONVENTION,
    USER_MODEL,
    USER_REVISION,
    add_sqla_jobs_versions,
    alembic,
    apply_recipe,
    drop_sqla_jobs_versions,
    make_user_project,
    set_target_metadata,
    skip_sqla_jobs_tables,
    start_project,
)

MIGRATE = documented("sqla-jobs", "migrate")
ADOPT = documented("sqla-jobs", "migrate", "--adopt")
UPGRADE = documented("alembic", "upgrade", "heads")
CHECK = documented("alembic", "check")
NOTHING_TO_DO = "No new upgrade operations detected"


@pytest.fixture
def scratch_url(server_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A database of the test's own, also as DATABASE_URL (the page's commands name none)."""
    url = create_database(server_url, prefix="sqla_jobs_mig")
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.delenv("SQLA_JOBS_SCHEMA", raising=False)
    try:
        yield url
    finally:
        drop_database(server_url, url)


def without_sqla_jobs_revisions(init_output: Path, root: Path, url: str) -> Path:
    """A project whose environment leaves sqla-jobs' revisions to ``sqla-jobs migrate``: its own
    version location only, and the include_name hook that hides sqla-jobs' tables."""
    ini = start_project(init_output, root, url, USER_MODEL.format(convention=USER_CONVENTION))
    apply_recipe(ini, target_metadata="Base.metadata", sqla_jobs_versions=False)
    skip_sqla_jobs_tables(ini)
    (root / "migrations" / "versions" / "myapp_0001_invoice.py").write_text(USER_REVISION)
    return ini


def test_sqla_jobs_migrate_works_beside_an_environment_that_leaves_it_its_revisions(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    ini = without_sqla_jobs_revisions(init_output, tmp_path, scratch_url)
    alembic(ini, *UPGRADE)

    assert main(list(MIGRATE)) == 0

    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"myapp_0001"}
    assert version_rows(scratch_url) == {SHIPPED_HEAD}
    # The application's environment neither sees sqla-jobs' tables nor their version table.
    assert NOTHING_TO_DO in alembic(ini, *CHECK).stdout
    alembic(ini, *UPGRADE)
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"myapp_0001"}


def test_moving_from_your_environment_to_sqla_jobs_migrate_takes_over_only_its_row(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    ini = make_user_project(init_output, tmp_path, scratch_url)
    alembic(ini, *UPGRADE)
    objects = sqla_jobs_objects(scratch_url)
    assert main(list(MIGRATE)) == 2  # the environment still runs them: refused

    # The page's steps: out of version_locations, the include_name hook, then --adopt.
    drop_sqla_jobs_versions(ini)
    set_target_metadata(ini, "Base.metadata")
    skip_sqla_jobs_tables(ini)
    assert main(list(ADOPT)) == 0

    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"myapp_0001"}
    assert version_rows(scratch_url) == {SHIPPED_HEAD}
    alembic(ini, *UPGRADE)
    assert NOTHING_TO_DO in alembic(ini, *CHECK).stdout
    assert main(list(MIGRATE)) == 0
    assert sqla_jobs_objects(scratch_url) == objects


def test_moving_from_sqla_jobs_migrate_to_your_environment_runs_nothing_again(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    ini = without_sqla_jobs_revisions(init_output, tmp_path, scratch_url)
    alembic(ini, *UPGRADE)
    assert main(list(MIGRATE)) == 0
    objects = sqla_jobs_objects(scratch_url)

    # The page's steps: the version location (the include_name hook stays), then stamp the
    # revision and drop sqla-jobs' own table.
    add_sqla_jobs_versions(ini)
    page = DOC.read_text(encoding="utf-8")
    assert "alembic stamp sqla_jobs_" in page
    assert "DROP TABLE sqla_jobs_alembic_version" in page
    (revision,) = version_rows(scratch_url)
    alembic(ini, "stamp", revision)
    execute_sql(scratch_url, "DROP TABLE sqla_jobs_alembic_version")
    alembic(ini, *UPGRADE)

    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"myapp_0001", SHIPPED_HEAD}
    assert "public.sqla_jobs_alembic_version" not in tables(scratch_url)
    assert sqla_jobs_objects(scratch_url) == objects
    assert NOTHING_TO_DO in alembic(ini, *CHECK).stdout
    # And sqla-jobs migrate now leaves them to the environment.
    assert main(list(MIGRATE)) == 2
