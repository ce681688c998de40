"""The package's architecture, held against its imports: layers that only point down, no import
cycle (type-only imports included), no module past 400 lines.

The layers, top to bottom. A module may import modules of its own layer or of a lower one, never
of a higher one; within a layer, the cycle check keeps the order. docs/architecture.md walks a job
through them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.packaging.imports import PACKAGE, Import, cycles, imports, modules

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # The entry points: the package's public face, the command, the pytest plugin.
    ("entry", ("sqla_jobs", "sqla_jobs.cli", "sqla_jobs.pytest_plugin")),
    # What runs on top of a worker or beside one: the web app, the test helpers.
    ("apps", ("sqla_jobs.dashboard", "sqla_jobs.testing")),
    ("worker", ("sqla_jobs.worker",)),
    # Observers of a worker and readers of what it recorded (through the Jobs facade).
    (
        "observe",
        ("sqla_jobs.observe", "sqla_jobs.metrics", "sqla_jobs.otel", "sqla_jobs.throughput"),
    ),
    # The facade an application holds.
    ("facade", ("sqla_jobs.jobs",)),
    # The facade's parts: enqueue, operations, periodic jobs, hooks, links, migrations.
    (
        "parts",
        (
            "sqla_jobs.enqueue",
            "sqla_jobs.operations",
            "sqla_jobs.periodic",
            "sqla_jobs.hooks",
            "sqla_jobs.links",
            "sqla_jobs.migrate",
            "sqla_jobs.migrations",
        ),
    ),
    # How a run ends: shared by the worker and sqla_jobs.testing, heard by hooks.
    ("rules", ("sqla_jobs._outcome",)),
    # What an application declares: kinds, their options, what a handler sees.
    (
        "domain",
        (
            "sqla_jobs.kinds",
            "sqla_jobs._handler_types",
            "sqla_jobs.context",
            "sqla_jobs.unique",
            "sqla_jobs.rate_limit",
            "sqla_jobs.backoff",
            "sqla_jobs.retention",
        ),
    ),
    ("db", ("sqla_jobs.db",)),
    ("sql", ("sqla_jobs.sql",)),
    ("base", ("sqla_jobs.model", "sqla_jobs.errors")),
]

MAX_LINES = 400


def layer_of(module: str) -> int:
    """The index of ``module``'s layer (0 is the top): the longest declared prefix decides."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise LookupError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best[1]


def upward(edges: list[Import]) -> list[str]:
    return [
        f"{edge}: {LAYERS[layer_of(edge.source)][0]} imports {LAYERS[layer_of(edge.target)][0]}"
        for edge in edges
        if layer_of(edge.target) < layer_of(edge.source)
    ]


def test_every_module_is_in_a_layer() -> None:
    unplaced = []
    for module in modules():
        try:
            layer_of(module)
        except LookupError:
            unplaced.append(module)
    assert unplaced == []


def test_imports_only_point_down() -> None:
    assert upward(list(imports())) == []


def test_there_is_no_import_cycle() -> None:
    assert cycles(list(imports())) == []


def test_no_module_is_over_400_lines() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_at_most_about_twenty_modules_sit_directly_in_the_package() -> None:
    top = [p.name for p in PACKAGE.glob("*.py")]
    assert len(top) <= 22, sorted(top)


def _copy_of_package(tmp_path: Path) -> Path:
    root = tmp_path / "sqla_jobs"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "versions"))
    return root


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    """The checks can fail: a type-only import from the bottom layer back to the facade closes a
    cycle (model.names -> jobs -> ... -> model) and points up."""
    root = _copy_of_package(tmp_path)
    model = root / "model" / "names.py"
    model.write_text(
        model.read_text()
        + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from sqla_jobs.jobs import Jobs\n"
    )
    edges = list(imports(root))
    assert any("sqla_jobs.model" in component for component in cycles(edges))
    assert any(line.startswith("sqla_jobs.model.names -> sqla_jobs.jobs") for line in upward(edges))


@pytest.mark.parametrize(
    ("source", "target"),
    [("sql/compiled.py", "sqla_jobs.worker.holdings"), ("jobs.py", "sqla_jobs.cli.common")],
)
def test_a_planted_upward_import_is_found(tmp_path: Path, source: str, target: str) -> None:
    root = _copy_of_package(tmp_path)
    path = root / source
    path.write_text(path.read_text() + f"\nimport {target}  # noqa\n")
    found = upward(list(imports(root)))
    assert any(target in line for line in found), found
