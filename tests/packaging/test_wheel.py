"""The wheel ships the library alone: no demo, benchmarks, tests or development helpers."""

from __future__ import annotations

import zipfile
from pathlib import Path


def test_the_wheel_holds_the_sqla_jobs_package_and_no_demo_bench_or_test_modules(
    built_wheel: Path,
) -> None:
    names = zipfile.ZipFile(built_wheel).namelist()

    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"sqla_jobs"}, sorted(tops)
    modules = [Path(name) for name in names if name.endswith(".py")]
    for unwanted in ("demo", "bench", "tests", "devdb", "examples"):
        shipped = [str(m) for m in modules if unwanted in m.parts or m.stem == unwanted]
        assert shipped == [], f"the wheel ships {unwanted} modules: {shipped}"
    # What the library needs at run time is there: its typing marker and its migrations.
    assert "sqla_jobs/py.typed" in names
    assert any(str(m).startswith("sqla_jobs/migrations/versions/") for m in modules)
