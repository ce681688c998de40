"""Fixtures shared by the integration tests: wakeups heard, and the garbage collector off."""

from __future__ import annotations

import gc
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


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic garbage collector off for the test (after a collection): what is still alive
    at its end is kept by references, not waiting for a collection."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
