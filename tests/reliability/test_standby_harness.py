"""The failover harness itself: a private primary and standby that stream, fail over and leave
nothing behind (see ``_standby``)."""

from __future__ import annotations

from typing import Any

import psutil

from tests.reliability._standby import Pair


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
