"""docs/migrations.md, "In your own Alembic environment", run end to end: a new project, an
existing one, and a table that references the job table. Each command is taken from the page
(``documented``), so the page cannot give a command that does not work; and no command may write
into the installed package (``new_revision``)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from tests.migrations._catalog import (
    SHARED_VERSIONS,
    connect,
    sqla_jobs_objects,
    tables,
    version_rows,
)
from tests.migrations._documented import DOC, documented
from tests.migrations._revision_files import SHIPPED_HEAD, package_untouched
from tests.migrations._user_project import (
    NEW_PROJECT_MODEL,
    alembic,
    apply_recipe,
    make_new_project,
    new_revision,
    start_project,
)

FIRST_REVISION = documented(
    "alembic",
    "revision",
    "--autogenerate",
    "-m",
    "create orders",
    "--head=base",
    "--branch-label=myapp",
    "--version-path=migrations/versions",
)
NEXT_REVISION = documented(
    "alembic", "revision", "--autogenerate", "-m", "add invoices", "--head=myapp@head"
)
LINK_REVISION = documented(
    "alembic",
    "revision",
    "--autogenerate",
    "-m",
    "link orders to jobs",
    "--head=myapp@head",
    "--depends-on=sqla_jobs@head",
)
UPGRADE = documented("alembic", "upgrade", "heads")
CHECK = documented("alembic", "check")
UNDO_OURS = documented("alembic", "downgrade", "myapp@-1")

INVOICES = """

class Invoice(Base):
    __tablename__ = "invoices"

    id: Mapped[int] = mapped_column(primary_key=True)
    total: Mapped[int]
"""
LINK = """

import sqla_jobs

order_jobs = sqla_jobs.link_table("order_jobs", Base.metadata, Order.id, column="order_id")
"""
#: An application's first revision, written before it used sqla-jobs: no branch label.
EXISTING_ROOT = '''\
"""create orders

Revision ID: 29b00b14549c
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "29b00b14549c"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("customer", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("orders")
'''
SQLA_JOBS_TABLES = {
    f"public.{name}"
    for name in ("sqla_jobs_job", "sqla_jobs_history", "sqla_jobs_queue", "sqla_jobs_schedule")
}


def add_to_model(ini: Path, source: str) -> None:
    models = ini.parent / "myapp" / "models.py"
    models.write_text(models.read_text() + source)


def test_a_new_projects_first_revision_starts_its_own_branch_in_its_own_folder(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    ini = make_new_project(init_output, tmp_path, scratch_url)
    alembic(ini, *UPGRADE)
    assert tables(scratch_url) >= SQLA_JOBS_TABLES

    first = new_revision(ini, *FIRST_REVISION)

    assert first.path.parent == tmp_path / "migrations" / "versions"
    assert first.down_revision is None
    assert first.branch_labels == ("myapp",)
    # Only the project's table: sqla-jobs' tables were there already, and stay its revisions'.
    assert first.upgrade.startswith("op.create_table('orders'")
    assert "sqla_jobs" not in first.upgrade
    alembic(ini, *UPGRADE)
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {first.revision, SHIPPED_HEAD}
    assert "No new upgrade operations detected" in alembic(ini, *CHECK).stdout

    add_to_model(ini, INVOICES)
    second = new_revision(ini, *NEXT_REVISION)
    assert second.down_revision == first.revision
    assert second.upgrade.startswith("op.create_table('invoices'")
    alembic(ini, *UPGRADE)
    ours = sqla_jobs_objects(scratch_url)

    alembic(ini, *UNDO_OURS)

    assert "public.invoices" not in tables(scratch_url)
    assert "public.orders" in tables(scratch_url)
    assert sqla_jobs_objects(scratch_url) == ours
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {first.revision, SHIPPED_HEAD}


def test_a_new_projects_first_revision_needs_head_base_and_version_path_as_the_page_says(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    """The two ways the report tried, refused by Alembic with the messages the page quotes."""
    ini = make_new_project(init_output, tmp_path, scratch_url)
    alembic(ini, *UPGRADE)
    page = " ".join(DOC.read_text(encoding="utf-8").split())

    with package_untouched():
        unlabelled = alembic(
            ini, "revision", "--autogenerate", "-m", "x", "--head=myapp@head", ok=False
        )
        located = alembic(ini, "revision", "--autogenerate", "-m", "x", "--head=base", ok=False)

    for refused, message in (
        (unlabelled, "Can't locate revision identified by 'myapp'"),
        (located, "Multiple version locations present"),
    ):
        assert message in refused.stdout + refused.stderr
        assert message in page
    assert list((tmp_path / "migrations" / "versions").glob("*.py")) == []


def test_an_existing_project_adds_sqla_jobs_beside_its_applied_history(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    # Before sqla-jobs: alembic init's environment, one revision, applied, a row in its table.
    ini = start_project(init_output, tmp_path, scratch_url, NEW_PROJECT_MODEL)
    root = tmp_path / "migrations" / "versions" / "29b00b14549c_create_orders.py"
    root.write_text(EXISTING_ROOT)
    alembic(ini, "upgrade", "head")
    with connect(scratch_url) as conn:
        conn.execute(text("INSERT INTO orders (customer) VALUES ('ada')"))

    # The page's edits: the recipe, and a branch label on the root revision.
    apply_recipe(ini)
    root.write_text(EXISTING_ROOT.replace("branch_labels = None", 'branch_labels = ("myapp",)'))
    alembic(ini, *UPGRADE)

    assert tables(scratch_url) >= SQLA_JOBS_TABLES | {"public.orders"}
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"29b00b14549c", SHIPPED_HEAD}
    with connect(scratch_url) as conn:
        assert conn.execute(text("SELECT customer FROM orders")).scalars().all() == ["ada"]
    assert "No new upgrade operations detected" in alembic(ini, *CHECK).stdout

    add_to_model(ini, INVOICES)
    invoices = new_revision(ini, *NEXT_REVISION)
    assert invoices.down_revision == "29b00b14549c"
    alembic(ini, *UPGRADE)
    ours = sqla_jobs_objects(scratch_url)
    alembic(ini, *UNDO_OURS)

    assert "public.invoices" not in tables(scratch_url)
    assert sqla_jobs_objects(scratch_url) == ours
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {"29b00b14549c", SHIPPED_HEAD}


def test_a_link_table_revision_made_with_depends_on_runs_after_the_job_table_both_ways(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    ini = make_new_project(init_output, tmp_path, scratch_url)
    alembic(ini, *UPGRADE)
    new_revision(ini, *FIRST_REVISION)
    alembic(ini, *UPGRADE)
    add_to_model(ini, LINK)

    link = new_revision(ini, *LINK_REVISION)

    assert link.depends_on == SHIPPED_HEAD
    assert "op.create_table('order_jobs'" in link.upgrade
    assert "['sqla_jobs_job.id']" in link.upgrade
    alembic(ini, *UPGRADE)
    # sqla-jobs' head is implied by the revision that depends on it (the page says so).
    assert version_rows(scratch_url, table=SHARED_VERSIONS) == {link.revision}
    assert "No new upgrade operations detected" in alembic(ini, *CHECK).stdout

    # Down to nothing and up again from an empty database: the dependency orders both ways.
    alembic(ini, "downgrade", "base")
    assert tables(scratch_url) == {"public.alembic_version"}
    alembic(ini, *UPGRADE)
    assert tables(scratch_url) >= SQLA_JOBS_TABLES | {"public.orders", "public.order_jobs"}
    assert "No new upgrade operations detected" in alembic(ini, *CHECK).stdout
