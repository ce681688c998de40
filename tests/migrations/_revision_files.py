"""Revision files as Alembic writes them: what they say, and where they must never land.

The package's versions folder is, in a development checkout, the working tree that other tests
(and people) use at the same time: a stray revision there would give the ``sqla_jobs`` branch a
second head under their feet. :func:`package_untouched` removes whatever a command wrote there,
and fails the test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from alembic.script import ScriptDirectory

import sqla_jobs
from sqla_jobs.migrate import alembic_config

PACKAGE_VERSIONS = Path(sqla_jobs.__file__).parent / "migrations" / "versions"


def _shipped_head() -> str:
    script = ScriptDirectory.from_config(alembic_config("postgresql://nobody@127.0.0.1:1/x"))
    head = script.get_current_head()
    assert head is not None
    return head


#: The newest revision this checkout ships (never hard-coded: every release adds one).
SHIPPED_HEAD = _shipped_head()


@dataclass(frozen=True)
class Revision:
    """One revision file: its identifiers, and its upgrade() and downgrade() bodies without
    docstrings and comments (``ast.unparse``)."""

    path: Path
    revision: str
    down_revision: object
    branch_labels: object
    depends_on: object
    upgrade: str
    downgrade: str


def read_revision(path: Path) -> Revision:
    """Parse the revision file at ``path`` (its module-level assignments are constants)."""
    module = ast.parse(path.read_text())
    values: dict[str, object] = {}
    bodies: dict[str, str] = {}
    for node in module.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and node.value is not None:
                    values[target.id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.FunctionDef) and node.name in ("upgrade", "downgrade"):
            statements = [
                s
                for s in node.body
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            bodies[node.name] = "\n".join(ast.unparse(s) for s in statements)
    return Revision(
        path=path,
        revision=str(values["revision"]),
        down_revision=values["down_revision"],
        branch_labels=values["branch_labels"],
        depends_on=values["depends_on"],
        upgrade=bodies["upgrade"],
        downgrade=bodies["downgrade"],
    )


@contextmanager
def package_untouched() -> Iterator[None]:
    """Fail the test if the block wrote a revision into the installed package's versions folder;
    remove it (and its bytecode) either way."""
    before = set(PACKAGE_VERSIONS.glob("*.py"))
    stray: set[Path] = set()
    try:
        yield
    finally:
        stray = set(PACKAGE_VERSIONS.glob("*.py")) - before
        for path in stray:
            path.unlink()
            for compiled in (PACKAGE_VERSIONS / "__pycache__").glob(f"{path.stem}.*"):
                compiled.unlink()
    assert not stray, f"a revision was written into the package: {sorted(p.name for p in stray)}"
