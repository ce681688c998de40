"""A link table (``sqla_jobs.link_table``) in a user's own Alembic environment, as
docs/sqlalchemy.md says: autogenerate writes it, foreign key to a table of another MetaData
included; with ``depends_on = "sqla_jobs"`` it is created after the job table from an empty
database, dropped before it on the way down, and ``alembic check`` then finds nothing to do."""

from __future__ import annotations

from pathlib import Path

from tests.migrations._catalog import SHARED_VERSIONS, connect, rows, tables, version_rows
from tests.migrations._user_project import alembic, autogenerate, make_user_project

LINK_MODEL = """

import sqla_jobs

invoice_jobs = sqla_jobs.link_table(
    "invoice_jobs", Base.metadata, Invoice.id, column="invoice_id"
)
"""


def foreign_keys(url: str, table: str) -> set[tuple[str, str]]:
    """(the constraint's definition, its referenced table) of each foreign key of ``table``."""
    with connect(url) as conn:
        return rows(
            conn,
            "SELECT pg_get_constraintdef(oid), confrelid::regclass::text FROM pg_constraint "
            "WHERE conrelid = CAST(:table AS regclass) AND contype = 'f'",
            table=table,
        )


def test_autogenerate_writes_the_link_table_and_it_migrates_up_and_down_after_the_job_table(
    init_output: Path, tmp_path: Path, scratch_url: str
) -> None:
    ini = make_user_project(init_output, tmp_path, scratch_url)
    models = tmp_path / "myapp" / "models.py"
    models.write_text(models.read_text() + LINK_MODEL)
    alembic(ini, "upgrade", "heads")

    upgrade = autogenerate(ini, "links")["upgrade"]
    assert "op.create_table('invoice_jobs'" in upgrade
    assert (
        "sa.ForeignKeyConstraint(['job_id'], ['sqla_jobs_job.id'], "
        "name=op.f('fk_invoice_jobs_job_id_sqla_jobs_job'), ondelete='CASCADE')"
    ) in upgrade
    assert (
        "sa.ForeignKeyConstraint(['invoice_id'], ['invoice.id'], "
        "name=op.f('fk_invoice_jobs_invoice_id_invoice'), ondelete='CASCADE')"
    ) in upgrade
    assert "sa.PrimaryKeyConstraint('invoice_id', 'job_id'" in upgrade
    assert "op.create_index(op.f('ix_invoice_jobs_job_id'), 'invoice_jobs', ['job_id']" in upgrade
    # Only the link table: the job table stays the package's revisions' business.
    assert [line.split("(")[0] for line in upgrade.splitlines()] == [
        "op.create_table",
        "op.create_index",
    ]

    # What docs/sqlalchemy.md asks for: the job table first, whatever order Alembic picks the branches in.
    (revision,) = (tmp_path / "migrations" / "versions").glob("*_links.py")
    source = revision.read_text()
    assert source.count("depends_on: Union[str, Sequence[str], None] = None") == 1
    revision.write_text(
        source.replace(
            "depends_on: Union[str, Sequence[str], None] = None",
            'depends_on: Union[str, Sequence[str], None] = "sqla_jobs"',
        )
    )
    alembic(ini, "upgrade", "heads")
    assert foreign_keys(scratch_url, "invoice_jobs") == {
        ("FOREIGN KEY (invoice_id) REFERENCES invoice(id) ON DELETE CASCADE", "invoice"),
        ("FOREIGN KEY (job_id) REFERENCES sqla_jobs_job(id) ON DELETE CASCADE", "sqla_jobs_job"),
    }
    assert "No new upgrade operations detected" in alembic(ini, "check").stdout

    # Down to nothing and up again from an empty database: the dependency orders both ways.
    alembic(ini, "downgrade", "base")
    assert tables(scratch_url) == {"public.alembic_version"}
    alembic(ini, "upgrade", "heads")
    assert "public.invoice_jobs" in tables(scratch_url)
    assert len(version_rows(scratch_url, table=SHARED_VERSIONS)) == 2
    assert "No new upgrade operations detected" in alembic(ini, "check").stdout
