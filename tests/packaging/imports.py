"""The package's imports, read from its source: every ``import`` and ``from ... import``, at module
level, inside functions and under ``if TYPE_CHECKING:`` alike (a type-only import still makes one
module need the other). Shared by the layering test and the planted-cycle test."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sqla_jobs"


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package (Alembic's revision files excluded: Alembic loads them)."""
    return {
        module_name(root, p): p
        for p in sorted(root.rglob("*.py"))
        if "__pycache__" not in p.parts and "versions" not in p.relative_to(root).parts
    }


def imports(root: Path = PACKAGE) -> Iterator[Import]:
    """Each import from one module of the package to another (``from pkg import mod`` counts as an
    import of ``pkg.mod``; a module importing its own package's ``__init__`` does not count)."""
    mods = modules(root)
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    stem = node.module or ""
                subs = [f"{stem}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in mods] or [stem]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in mods and target != name and not name.startswith(target + "."):
                    yield Import(name, target, node.lineno)


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
