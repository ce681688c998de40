"""A user's own project with its own Alembic environment, built the way docs/migrations.md says.

The project is what ``alembic init migrations`` generates, plus the recipe's edits: two
version_locations in alembic.ini and ``target_metadata`` in env.py. :func:`make_user_project` is
an existing project: its own model (an ``invoice`` table on its own MetaData and naming
convention) and its own first revision on a branch labelled ``myapp``. :func:`make_new_project`
is a new one: a model (``orders``) and no revision yet. Commands run as ``python -m alembic``
subprocesses in the project.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from sqla_jobs.db.urls import sqlalchemy_url
from tests.migrations._revision_files import Revision, package_untouched, read_revision

#: The naming convention from SQLAlchemy's documentation. Its "ck" uses %(constraint_name)s, so it
#: renames every check constraint whose name is not final (not wrapped in op.f()).
USER_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

USER_MODEL = """\
from decimal import Decimal

from sqlalchemy import CheckConstraint, MetaData, Numeric, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention={convention!r})


class Invoice(Base):
    __tablename__ = "invoice"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(Text)
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))

    __table_args__ = (
        CheckConstraint("amount >= 0", name="amount_not_negative"),
        CheckConstraint("customer <> ''", name="customer_not_empty"),
    )
"""

USER_REVISION = '''\
"""invoice

Revision ID: myapp_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "myapp_0001"
down_revision = None
branch_labels = ("myapp",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "invoice",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("customer", sa.Text(), nullable=False),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
        sa.CheckConstraint("amount >= 0", name=op.f("ck_invoice_amount_not_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invoice")),
    )
    # A bare name: the final one comes from target_metadata's naming convention, if any.
    op.create_check_constraint("customer_not_empty", "invoice", "customer <> ''")


def downgrade() -> None:
    op.drop_table("invoice")
'''

#: A new project's model: one table, no naming convention (what ``alembic init`` users start with).
NEW_PROJECT_MODEL = """\
from sqlalchemy import Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(Text)
"""

#: The recipe's env.py line.
RECIPE_TARGET_METADATA = "[Base.metadata, sqla_jobs.metadata]"
#: The recipe's alembic.ini lines, and the form for a project path that contains spaces.
VERSION_LOCATIONS = {
    "space": "version_locations = %(here)s/migrations/versions sqla_jobs:migrations/versions\n",
    "newline": "version_locations =\n"
    "    %(here)s/migrations/versions\n"
    "    sqla_jobs:migrations/versions\n",
}
#: An environment that leaves sqla-jobs' revisions to ``sqla-jobs migrate``.
OWN_LOCATION_ONLY = "version_locations = %(here)s/migrations/versions\n"
#: Names the sqla_jobs revision gives its constraints; no naming convention may change them.
OUR_CONSTRAINTS = {
    "sqla_jobs_job_pkey",
    "sqla_jobs_history_pkey",
    "sqla_jobs_queue_pkey",
    "sqla_jobs_schedule_pkey",
    *(
        f"sqla_jobs_job_{name}_check"
        for name in ("state", "lease", "counters", "budgets", "last_error", "queue", "unique")
    ),
}
_RECIPE_MARKER = "# sqla-jobs recipe\n"


def alembic(ini: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m alembic -c ini ARGS`` in the project directory; assert it succeeded (or,
    with ``ok=False``, that it failed). DATABASE_URL is removed: the URL is the ini's."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), *args],
        cwd=ini.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if ok:
        assert done.returncode == 0, f"alembic {' '.join(args)}:\n{done.stdout}{done.stderr}"
    else:
        assert done.returncode != 0, f"alembic {' '.join(args)} should have failed"
    return done


def alembic_init(directory: Path) -> Path:
    """``alembic init migrations`` in ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    alembic(directory / "alembic.ini", "init", "migrations")
    return directory


def make_user_project(
    init_output: Path,
    root: Path,
    url: str,
    *,
    separator: str = "space",
    target_metadata: str = RECIPE_TARGET_METADATA,
    convention: dict[str, str] = USER_CONVENTION,
    extra_ini: str = "",
) -> Path:
    """Copy what ``alembic init`` wrote into ``root``, apply the recipe, add the user's model and
    first revision, and point sqlalchemy.url at ``url``. Returns the project's alembic.ini."""
    ini = start_project(init_output, root, url, USER_MODEL.format(convention=convention))
    apply_recipe(ini, separator=separator, target_metadata=target_metadata, extra_ini=extra_ini)
    (root / "migrations" / "versions" / "myapp_0001_invoice.py").write_text(USER_REVISION)
    return ini


def make_new_project(init_output: Path, root: Path, url: str) -> Path:
    """A new project: ``alembic init``'s output with the recipe applied, a model
    (:data:`NEW_PROJECT_MODEL`), sqlalchemy.url set to ``url``, and no revision of its own."""
    ini = start_project(init_output, root, url, NEW_PROJECT_MODEL)
    apply_recipe(ini)
    return ini


def start_project(init_output: Path, root: Path, url: str, model: str) -> Path:
    """Copy what ``alembic init`` wrote into ``root``, point sqlalchemy.url at ``url`` and write
    ``model`` as myapp/models.py; sqla-jobs is not in it yet. Returns its alembic.ini."""
    shutil.copytree(init_output, root, dirs_exist_ok=True)
    ini = root / "alembic.ini"
    ini.write_text(
        _replace_once(
            ini.read_text(),
            "sqlalchemy.url = driver://user:pass@localhost/dbname",
            "sqlalchemy.url = " + sqlalchemy_url(url).replace("%", "%%"),
        )
    )
    (root / "myapp").mkdir()
    (root / "myapp" / "__init__.py").write_text("")
    (root / "myapp" / "models.py").write_text(model)
    return ini


def apply_recipe(
    ini: Path,
    *,
    separator: str = "space",
    target_metadata: str = RECIPE_TARGET_METADATA,
    extra_ini: str = "",
    sqla_jobs_versions: bool = True,
) -> None:
    """The recipe's edits to alembic.ini (version_locations, path_separator) and env.py
    (target_metadata). ``sqla_jobs_versions=False``: an environment that leaves sqla-jobs'
    revisions to ``sqla-jobs migrate`` (its own location only)."""
    source = ini.read_text()
    location = "script_location = %(here)s/migrations\n"
    locations = VERSION_LOCATIONS[separator] if sqla_jobs_versions else OWN_LOCATION_ONLY
    source = _replace_once(source, location, location + locations + extra_ini)
    source = _replace_once(source, "\npath_separator = os\n", f"\npath_separator = {separator}\n")
    ini.write_text(source)
    set_target_metadata(ini, target_metadata)


def drop_sqla_jobs_versions(ini: Path) -> None:
    """Take ``sqla_jobs:migrations/versions`` out of the project's version_locations."""
    source = ini.read_text()
    ini.write_text(_replace_once(source, VERSION_LOCATIONS["space"], OWN_LOCATION_ONLY))


def add_sqla_jobs_versions(ini: Path) -> None:
    """Put ``sqla_jobs:migrations/versions`` into the project's version_locations."""
    source = ini.read_text()
    ini.write_text(_replace_once(source, OWN_LOCATION_ONLY, VERSION_LOCATIONS["space"]))


def set_target_metadata(ini: Path, expression: str) -> None:
    """Make the project's env.py say ``target_metadata = <expression>`` (Base and sqla_jobs are
    imported for it)."""
    env = ini.parent / "migrations" / "env.py"
    source = env.read_text()
    if _RECIPE_MARKER not in source:
        imports = "import sqla_jobs\nfrom myapp.models import Base\n\n"
        source = _replace_once(
            source, "target_metadata = None\n", f"{_RECIPE_MARKER}{imports}target_metadata = None\n"
        )
    head, _, tail = source.partition(_RECIPE_MARKER)
    lines = tail.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("target_metadata = "))
    lines[at] = f"target_metadata = {expression}"
    env.write_text(head + _RECIPE_MARKER + "\n".join(lines))


#: The alternative to listing sqla_jobs.metadata: hide our tables from autogenerate.
INCLUDE_NAME = """

def include_name(name, type_, parent_names):
    # sqla-jobs' tables belong to its own revisions (branch sqla_jobs).
    return not (type_ == "table" and name.startswith("sqla_jobs_"))
"""


def skip_sqla_jobs_tables(ini: Path) -> None:
    """Add the ``include_name`` hook above to the project's env.py and pass it to Alembic."""
    env = ini.parent / "migrations" / "env.py"
    source = env.read_text()
    configured = "target_metadata=target_metadata"
    assert source.count(configured) == 2, "the alembic init template changed"
    source = source.replace(configured, f"{configured}, include_name=include_name")
    source = _replace_once(
        source, "\n\ndef run_migrations_offline", INCLUDE_NAME + "\n\ndef run_migrations_offline"
    )
    env.write_text(source)


def new_revision(ini: Path, *args: str) -> Revision:
    """Run ``alembic ARGS`` (a ``revision`` command) and return the one revision it wrote into the
    project's own versions folder; fails if it wrote into the installed package instead."""
    versions = ini.parent / "migrations" / "versions"
    before = set(versions.glob("*.py"))
    with package_untouched():
        alembic(ini, *args)
    written = set(versions.glob("*.py")) - before
    assert len(written) == 1, f"alembic {' '.join(args)} wrote {sorted(written)} in {versions}"
    return read_revision(written.pop())


def autogenerate(ini: Path, message: str) -> dict[str, str]:
    """``alembic revision --autogenerate -m MESSAGE --head=myapp@head``. Asserts the revision was
    written to the user's versions directory on top of myapp_0001 (never into the installed
    package); returns its upgrade() and downgrade() bodies without docstring and comments."""
    written = new_revision(ini, "revision", "--autogenerate", "-m", message, "--head=myapp@head")
    assert written.down_revision == "myapp_0001"
    return {"upgrade": written.upgrade, "downgrade": written.downgrade}


def discard_revision(ini: Path, message: str) -> None:
    """Delete the revision ``autogenerate(ini, message)`` wrote (it is never applied)."""
    for path in (ini.parent / "migrations" / "versions").glob(f"*_{message}.py"):
        path.unlink()


def _replace_once(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"the alembic init template changed: {old!r} not found once"
    return source.replace(old, new)
