"""The migration tests' shared fixtures: a database of each test's own, and ``alembic init``'s
output generated once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import create_database, drop_database

from ._user_project import alembic_init


@pytest.fixture
def scratch_url(server_url: str) -> Iterator[str]:
    """A database of this test's own, dropped when the test ends."""
    url = create_database(server_url, prefix="sqla_jobs_mig")
    try:
        yield url
    finally:
        drop_database(server_url, url)


@pytest.fixture(scope="module")
def init_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``alembic init migrations`` writes, generated once and copied into each project."""
    return alembic_init(tmp_path_factory.mktemp("alembic_init"))
