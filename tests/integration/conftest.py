"""Fixtures shared by the integration tests of wakeups."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sqla_jobs import Jobs
from sqla_jobs.enqueue import notifier as _notifier
from tests._waiting import DEADLINE

from ._listening import Heard


@pytest.fixture
def heard(migrated_url: str) -> Iterator[Heard]:
    """A LISTEN connection on the jobs' channel, past what earlier tests left on it."""
    made = Heard(migrated_url, Jobs().channel)
    try:
        assert _notifier.flush_all(DEADLINE)
        made.drain()
        yield made
    finally:
        # Closed even when the setup fails: a connection left to the garbage collector warns
        # in whichever test runs then, and warnings are errors.
        made.close()
