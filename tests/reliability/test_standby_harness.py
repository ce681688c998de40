"""The failover harness itself: a private primary and standby that stream, fail over and leave
nothing behind (see ``_standby``)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from tests.reliability import _ports, _replica_pair, _standby
from tests.reliability._standby import Pair


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port another process listens on for as long as the block runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _first(port: int, then: Callable[[], int], times: int = 1) -> Callable[[], int]:
    """A ``free_port`` that gives ``port`` for its first ``times`` calls, then free ones."""
    given = iter([port] * times)
    return lambda: next(given, None) or then()


def test_the_standby_streams_and_only_the_primary_waits_for_it(ha_pair: Pair) -> None:
    """Synchronous replication is set on the primary only: the promoted standby commits alone"""
    ha_pair.make_sync()
    assert ha_pair.primary.sql("SHOW synchronous_standby_names") == "*"
    assert ha_pair.standby.sql("SHOW synchronous_standby_names") == ""
    assert ha_pair.standby.in_recovery()
    ha_pair.primary.sql("INSERT INTO fo_effects (token, job_id, attempt, crashes) VALUES (1,1,1,0)")
    # Synchronous: the row is on the standby's disk when the commit returns; replayed soon after.
    ha_pair.wait_replayed()
    assert ha_pair.standby.sql("SELECT count(*) FROM fo_effects") == 1
    ha_pair.primary.stop("immediate")
    ha_pair.standby.promote()
    assert not ha_pair.standby.in_recovery()
    # Would hang forever had the standby inherited synchronous_standby_names.
    ha_pair.standby.sql("INSERT INTO fo_effects (token, job_id, attempt, crashes) VALUES (2,2,1,0)")
    assert ha_pair.standby.sql("SELECT count(*) FROM fo_effects") == 2


def test_read_only_freeze_and_teardown_leave_no_server_behind(ha_servers: Any) -> None:
    """A read-only, then frozen primary is stopped and removed with its pair"""
    with ha_servers.pair() as pair:
        pair.primary.read_only()
        assert pair.primary.sql("SHOW default_transaction_read_only") == "on"
        assert pair.standby.sql("SHOW default_transaction_read_only") == "off"
        pair.primary.freeze()
        pids = list(pair.primary.frozen)
        assert pids
        base = pair.primary.pgdata.parent
    assert not base.exists()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_a_pair_whose_ports_are_taken_starts_on_others(
    ha_servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parallel test may take a chosen port before the server binds it: the server moves"""
    with taken_port() as port:
        monkeypatch.setattr(_standby, "free_port", _first(port, _ports.free_port))
        with ha_servers.pair() as pair:
            assert port not in (pair.primary.port, pair.standby.port)
            pair.wait_streaming()
            assert pair.standby.in_recovery()


def test_a_replica_pair_whose_ports_are_taken_starts_on_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read-replica tests' pair moves too, and both of its servers still answer"""
    with taken_port() as port:
        monkeypatch.setattr(_replica_pair, "free_port", _first(port, _ports.free_port, 2))
        with _replica_pair.streaming_pair() as pair:
            assert port not in (pair.primary_port, pair.standby_port)
            with pair.connect("standby") as standby:
                assert standby.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
