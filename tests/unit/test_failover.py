"""The failover classifier, the outage account and the outcome of a run that met a failover,
without a database (tests/integration/test_failover_errors.py holds the errors a real server
raises)."""

from __future__ import annotations

import atexit
import logging
import socket
import threading
from typing import cast

import psycopg
import pytest
from psycopg import errors
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError as SAOperationalError

from sqla_jobs import Jobs
from sqla_jobs._outcome import LOST_RETRY_US, failed
from sqla_jobs.db.connections import Conn, Reconnects, serve, should_reconnect
from sqla_jobs.db.failover import caused_by_lost, is_lost, is_lost_state
from sqla_jobs.db.outage import Outage

from ._claimed import claimed_job

LOST = [
    errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
    errors.ReadOnlySqlTransaction("cannot execute LISTEN during recovery"),
    errors.AdminShutdown("terminating connection due to administrator command"),
    errors.CrashShutdown("terminating connection because of crash of another server process"),
    errors.CannotConnectNow("the database system is starting up"),
    errors.FeatureNotSupported("cannot set transaction read-write mode during recovery"),
    errors.ObjectNotInPrerequisiteState("recovery is in progress"),
    psycopg.OperationalError("connection failed: Connection refused"),
    psycopg.OperationalError("the connection is closed"),
    psycopg.InterfaceError("the connection is lost"),
]
NOT_LOST = [
    errors.DeadlockDetected("deadlock detected"),
    errors.LockNotAvailable("canceling statement due to lock timeout"),
    errors.QueryCanceled("canceling statement due to statement timeout"),
    errors.FeatureNotSupported("cannot use a cursor here"),
    errors.UniqueViolation("duplicate key value"),
    errors.InsufficientPrivilege("permission denied for table sqla_jobs_worker"),
    errors.UndefinedTable('relation "sqla_jobs_throughput" does not exist'),
    errors.PipelineAborted("pipeline aborted"),
    ValueError("not a database error"),
]


@pytest.mark.parametrize("exc", LOST, ids=lambda e: f"{type(e).__name__}: {e}")
def test_errors_of_a_lost_or_demoted_server_are_lost_connections(exc: Exception) -> None:
    assert is_lost(exc)
    assert should_reconnect(exc)
    wrapped = SAOperationalError("SELECT 1", {}, exc)
    assert is_lost(wrapped)


@pytest.mark.parametrize("exc", NOT_LOST, ids=lambda e: f"{type(e).__name__}: {e}")
def test_errors_a_retry_or_a_fix_cures_are_not_lost_connections(exc: Exception) -> None:
    assert not is_lost(exc)


def test_a_raw_result_is_classified_by_its_sqlstate_and_message() -> None:
    assert is_lost_state("25006", "cannot execute NOTIFY during recovery")
    assert is_lost_state("08006", "connection failure")
    assert is_lost_state("55000", "recovery is in progress")
    assert not is_lost_state("42501", "permission denied for function pg_notify")


def test_an_error_raised_from_a_lost_connection_is_caused_by_it() -> None:
    try:
        raise errors.AdminShutdown("terminating connection due to administrator command")
    except psycopg.Error as exc:
        outer = RuntimeError("could not save the order")
        outer.__cause__ = exc
    assert caused_by_lost(outer)
    assert not is_lost(outer)
    assert not caused_by_lost(RuntimeError("just a bug"))


class Order(BaseModel):
    order_id: int


JOBS = Jobs()
KIND = JOBS.register("order", Order, lambda args, ctx: None)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_session_run_that_met_a_failover_goes_back_without_an_attempt_charged() -> None:
    job = claimed_job(kind="order", payload='{"order_id": 1}')
    lost = SAOperationalError("COMMIT", {}, errors.AdminShutdown("terminating connection"))
    outcome = failed(job, KIND, _raised(lost), in_session=True)
    assert (outcome.error, outcome.snooze_us) == (None, LOST_RETRY_US)
    assert outcome.lost is not None
    assert "AdminShutdown" in outcome.lost
    # Without a Session on the queue's database, a lost connection is the handler's own
    # failure (another database, say): charged as any error, so max_attempts still bounds it.
    charged = failed(job, KIND, _raised(lost), in_session=False)
    assert charged.error is not None
    assert charged.snooze_us is None
    bug = failed(job, KIND, _raised(ValueError("bad")), in_session=True)
    assert bug.error is not None
    assert bug.snooze_us is None


class Info:
    host, port = "db2.internal", 5432

    def parameter_status(self, name: str) -> str:
        return "off"


class Primary:
    """A connection to a server that takes writes, as far as :meth:`Reconnects.ok` looks: its
    socket is one end of a socket pair, quiet until the other end writes or closes."""

    closed = False
    info = Info()

    def __init__(self) -> None:
        self.sock, self.server = socket.socketpair()

    def fileno(self) -> int:
        return self.sock.fileno()


_PRIMARY = Primary()
PRIMARY = cast(Conn, _PRIMARY)
# Closed when the test process exits: left to the collector, they warn (ResourceWarning).
atexit.register(_PRIMARY.server.close)
atexit.register(_PRIMARY.sock.close)
#: A connection ended by the server (pg_terminate_backend, a clean shutdown): never raised here.
KILLED = errors.AdminShutdown("terminating connection due to administrator command")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends_whatever_the_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = Outage(clock=clock)
    threads = [Reconnects(name, "conn_lost", outage=outage) for name in ("claim", "reaper")]
    demoted = errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction")
    with caplog.at_level(logging.DEBUG, logger="sqla_jobs.worker"):
        for _ in range(50):
            for each in threads:
                delay = each.lost(demoted)
                assert 0.0 < delay <= 5.0
            clock.now += 0.5
        threads[0].ok(PRIMARY)
        # The reaper was asleep through the end: its first failure on the old server is an echo.
        threads[1].lost(demoted)
        threads[1].ok(PRIMARY)
    said = _said(caplog)
    assert len(said) == 2, said
    assert "ReadOnlySqlTransaction" in said[0]
    assert "not the primary" in said[0]
    assert said[1] == (
        "database back after 25.0s (100 failed attempts): claim works again on db2.internal:5432"
    )


def test_a_worker_that_finds_no_primary_says_so_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = Outage(clock=clock)
    reconnects = Reconnects("claim", "conn_lost", outage=outage)
    standby = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5433 failed: '
        "session is read-only"
    )
    with caplog.at_level(logging.DEBUG, logger="sqla_jobs.worker"):
        for _ in range(600):  # ten minutes of a retry a second
            reconnects.lost(standby)
            clock.now += 1.0
    said = _said(caplog)
    assert 10 <= len(said) <= 11, said
    assert all("read-only" in line for line in said)
    assert said[1].startswith("still no database that takes writes, after 60s")


def test_a_new_outage_after_the_last_one_ended_is_said_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage(clock=Clock())
    reconnects = Reconnects("claim", "conn_lost", outage=outage)
    with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
        for _ in range(3):
            reconnects.lost(KILLED)
            reconnects.ok(PRIMARY)
    assert len(_said(caplog)) == 6


def test_a_fault_after_an_outage_ended_is_said_even_on_a_connection_that_never_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The claim lane worked through the listener's outage; its own fault after the outage ended
    is a new outage, not an echo of the ended one (only a connection that has not worked since an
    outage began may echo it)."""
    outage = Outage(clock=Clock())
    listener = Reconnects("listener", "listener_lost", outage=outage)
    lane = Reconnects("claim", "conn_lost", outage=outage)
    with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
        lane.ok(PRIMARY)
        listener.lost(KILLED)
        lane.ok(PRIMARY)  # claims while the listener is away
        listener.ok(PRIMARY)
        lane.lost(KILLED)
        lane.ok(PRIMARY)
    said = _said(caplog)
    assert len(said) == 4, said
    assert said[2].startswith("database connection lost (claim, AdminShutdown")


def test_a_thread_asleep_through_an_outage_echoes_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection that has not worked since before the outage began fails after its end on
    the old server: one quiet failure; a second one without a success between is a new outage."""
    outage = Outage(clock=Clock())
    claim = Reconnects("claim", "conn_lost", outage=outage)
    reaper = Reconnects("reaper", "conn_lost", outage=outage)
    with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
        reaper.ok(PRIMARY)
        claim.lost(KILLED)
        reaper.ok(PRIMARY, used=False)  # an idle step: its connection may be dead already
        claim.ok(PRIMARY)
        reaper.lost(KILLED)
        assert len(_said(caplog)) == 2
        reaper.lost(KILLED)
    assert len(_said(caplog)) == 3


def test_an_idle_connection_that_lived_through_an_outage_reports_its_next_fault(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Claim lanes idle through another connection's outage: one whose socket is quiet once the
    outage is over lived through it, and a fault on it later is a new outage, said; one whose
    server ended it (EOF to read on its socket) fails as that outage's echo, unsaid (seen in CI:
    a backend killed on the second lane, after one killed on the first, went unsaid)."""
    outage = Outage(clock=Clock())
    first, second, third = (Reconnects("claim", "conn_lost", outage=outage) for _ in range(3))
    alive, ended = Primary(), Primary()
    try:
        with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
            first.lost(KILLED)
            first.ok(PRIMARY)  # the outage is over: lost, back
            ended.server.close()
            second.ok(cast(Conn, alive), used=False)
            third.ok(cast(Conn, ended), used=False)
            third.lost(KILLED)
            assert len(_said(caplog)) == 2, "the ended connection's failure is the echo"
            second.lost(KILLED)
        assert len(_said(caplog)) == 3, "the live connection's failure is news"
    finally:
        for sock in (alive.sock, alive.server, ended.sock):
            sock.close()


def test_the_reapers_grace_outlasts_the_slowest_heartbeat_back_from_the_same_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an outage longer than the lease, another worker's heartbeat thread may be asleep in
    its longest backoff, then spend a whole connection attempt, then wait a beat: the first reaper
    back must hold off longer than that, or it charges a live run a crash (seen in CI, where the
    grace was one lease and the backoff reached five seconds)."""
    from datetime import timedelta

    from sqla_jobs.db.connections import Connector
    from sqla_jobs.sql.compiled import WorkerSQL
    from sqla_jobs.worker.leases import LeaseKeeper
    from sqla_jobs.worker.reaper import reap_grace

    lease, beat = 4.0, 1.0
    keeper = LeaseKeeper(
        connector=Connector("host=nowhere", worker="w"),
        sql=cast("WorkerSQL", None),  # never used: the thread is not started
        lease=timedelta(seconds=lease),
        heartbeat=beat,
        snapshot=list,
        on_lost=lambda held: None,
    )
    monkeypatch.setattr("random.uniform", lambda low, high: high)  # the jitter at its longest
    reconnects = keeper._reconnects
    reconnects._outage = Outage()  # not the process's account
    longest = max(reconnects.lost(KILLED) for _ in range(40))
    slowest_renewal = longest + keeper._connect_timeout + beat
    assert reap_grace(lease, beat) >= lease + slowest_renewal


def test_a_step_whose_statement_ran_just_before_the_outage_began_echoes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen in CI (test_async_replication_counts_what_it_loses[pg18]): the lease thread's step
    ran its statement on the old primary a moment before the primary stopped, and told its
    success just after the listener had begun the outage. Counted as working since that outage
    began, its connection's next failure, a second later on the dead server, was said as a new
    outage (two more lines). The step's success counts from when the step began."""
    outage = Outage(clock=Clock())
    listener = Reconnects("listener", "listener_lost", outage=outage)
    lease = Reconnects("lease connection", "lease_conn_lost", outage=outage)
    stop = threading.Event()
    steps = iter(["ran", "dead", "back"])

    def step() -> float:
        what = next(steps)
        if what == "ran":
            # The statement worked; the primary stops now, and the listener notices first.
            listener.lost(KILLED)
            listener.ok(PRIMARY)
        elif what == "dead":
            raise KILLED
        else:
            stop.set()
        return 0.0

    with caplog.at_level(logging.WARNING, logger="sqla_jobs.worker"):
        serve(stop, step, lease, close=lambda: None, wait=lambda s: None, current=lambda: PRIMARY)
    said = _said(caplog)
    assert len(said) == 2, said
    assert said[0].startswith("database connection lost (listener")
