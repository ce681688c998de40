"""The after-commit notifier under faults: descriptors past select()'s 1024, a statement the server
refuses, an error no one foresaw in its thread, a failure to reach it from the commit hook, a
lock held while commits go on. A wakeup is a hint (workers poll), but a notifier must neither
die, nor hammer the server, nor turn a committed transaction into an exception, nor make a
commit wait."""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, make_url, text
from sqlalchemy.orm import Session

from sqla_jobs import ConfigurationError, Jobs
from sqla_jobs.db.urls import libpq_conninfo
from sqla_jobs.enqueue import notifier as _notifier
from sqla_jobs.enqueue import notifier_thread as _notifier_thread
from sqla_jobs.enqueue.notifier import Notifier
from tests._waiting import DEADLINE

from ._listening import ARRIVES, QUIET, Heard
from ._workers import wait_until

CHANNEL = Jobs().channel


class Ping(BaseModel):
    pass


@pytest.fixture
def start() -> Iterator[Any]:
    """Start a notifier of the test's own (not the process's) on a conninfo; stopped after."""
    started: list[Notifier] = []

    def make(conninfo: str) -> Notifier:
        notifier = Notifier(conninfo)
        notifier.start()
        started.append(notifier)
        return notifier

    yield make
    for notifier in started:
        notifier.stop()
        notifier.join(10)
        assert not notifier.is_alive()


def events(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum(getattr(r, "event", None) == name for r in caplog.records)


def test_descriptors_past_1024_do_not_stop_the_wakeups(
    migrated_url: str, heard: Heard, start: Any
) -> None:
    """select() cannot watch a descriptor of 1024 or more; a busy process has them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if soft != -1 else soft, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        notifier = start(libpq_conninfo(migrated_url))
        notifier.send([(CHANNEL, "high")])
        assert heard.within(ARRIVES) == ["high"]
        time.sleep(0.1)  # the thread waits idle, on its connection's descriptor too
        notifier.send([(CHANNEL, "again")])
        assert heard.within(ARRIVES) == ["again"]
        assert notifier.is_alive()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_wakeup_already_pending_is_left_to_the_next_statement_without_waiting_for_the_lock(
    migrated_url: str, heard: Heard, start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two sends a busy process commits many times, most of them for a queue already
    pending: such a commit hands nothing over, and does not wait for the lock that the thread,
    or another committing thread, holds. The next statement carries the queue, once."""
    monkeypatch.setattr(_notifier_thread, "INTERVAL", 0.5)  # the second send must wait for it
    notifier = start(libpq_conninfo(migrated_url))
    notifier.send([(CHANNEL, "first")])
    assert heard.within(ARRIVES) == ["first"]
    notifier.send([(CHANNEL, "busy")])  # within the interval: pending
    returned = threading.Event()
    fresh = threading.Event()

    def commit_again(queue: str, done: threading.Event) -> None:
        notifier.send([(CHANNEL, queue)])
        done.set()

    with notifier._cond:
        threading.Thread(target=commit_again, args=("busy", returned)).start()
        assert returned.wait(DEADLINE), "a pending wakeup waited for the notifier's lock"
        # A queue not pending yet must be added under the lock: this one waits for it.
        threading.Thread(target=commit_again, args=("fresh", fresh)).start()
    assert fresh.wait(DEADLINE)
    got = heard.within(ARRIVES)
    while len(got) < 2 and (more := heard.within(ARRIVES)):
        got += more
    assert sorted(got) == ["busy", "fresh"]
    assert heard.within(QUIET) == []


@pytest.fixture
def refused_role(clean: Engine) -> Iterator[tuple[str, Any]]:
    """A login role that may not call pg_notify (revoked from PUBLIC in this database), and a
    function that grants it back."""
    role = f"sqla_jobs_no_notify_{os.getpid()}"
    with clean.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text("REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC"))

    def grant() -> None:
        with clean.begin() as conn:
            conn.execute(text(f'GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO "{role}"'))

    try:
        yield role, grant
    finally:
        with clean.begin() as conn:
            conn.execute(text("GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO PUBLIC"))
            conn.execute(text(f'REVOKE ALL ON FUNCTION pg_notify(text, text) FROM "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))


def test_a_statement_the_server_refuses_keeps_the_connection_and_is_logged_once(
    migrated_url: str,
    heard: Heard,
    start: Any,
    refused_role: tuple[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The wakeups are dropped (workers poll), not retried on a new connection each time."""
    role, grant = refused_role
    url = make_url(migrated_url).set(username=role, password=None)
    notifier = start(libpq_conninfo(url.render_as_string(hide_password=False)))
    with caplog.at_level(logging.INFO, logger="sqla_jobs.enqueue.insert"):
        for n in range(5):
            notifier.send([(CHANNEL, f"refused{n}")])
            assert notifier.flush(5), "a refused statement stays in flight"
        assert heard.within(0.3) == []
        assert notifier.connects == 1, "reconnected after the server refused a statement"
        assert events(caplog, "notifier_failed") == 1
        grant()
        notifier.send([(CHANNEL, "granted")])
        assert heard.within(ARRIVES) == ["granted"]
        assert notifier.flush(5)
        assert notifier.connects == 1
        assert events(caplog, "notifier_back") == 1


def test_an_unforeseen_error_in_the_thread_does_not_end_the_wakeups(
    migrated_url: str,
    heard: Heard,
    start: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    original = Notifier._answered
    raised: list[bool] = []

    def once(self: Notifier, pgconn: Any) -> None:
        if not raised:
            raised.append(True)
            raise RuntimeError("a bug")
        original(self, pgconn)

    monkeypatch.setattr(Notifier, "_answered", once)
    notifier = start(libpq_conninfo(migrated_url))
    with caplog.at_level(logging.WARNING, logger="sqla_jobs.enqueue.insert"):
        notifier.send([(CHANNEL, "first")])
        assert heard.within(ARRIVES) == ["first"]
        assert raised
        # The thread dropped its connection and sends the interrupted batch again on its next
        # one (a wakeup twice costs a claim that finds nothing), then what follows.
        wait_until(lambda: notifier.connects == 2, what="reconnected")
        notifier.send([(CHANNEL, "second")])
        got = heard.within(ARRIVES)
        while "second" not in got and (more := heard.within(2)):
            got += more
        assert set(got) == {"first", "second"}, got
    assert notifier.is_alive()
    assert events(caplog, "notifier_failed") == 1


def test_a_statement_left_unanswered_counts_as_a_lost_connection(
    migrated_url: str, heard: Heard, start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server gone silent (a NAT that dropped the connection) holds no wakeup for longer than
    ANSWER_TIMEOUT: the notifier reconnects and sends them again."""
    monkeypatch.setattr(_notifier_thread, "ANSWER_TIMEOUT", 0.5)
    original = Notifier._statement
    stalled: list[bool] = []

    def stall_once(self: Notifier, conn: Any, batch: list[tuple[str, str]]) -> bytes:
        if not stalled:
            stalled.append(True)
            return b"SELECT pg_sleep(5)"
        return original(self, conn, batch)

    monkeypatch.setattr(Notifier, "_statement", stall_once)
    notifier = start(libpq_conninfo(migrated_url))
    notifier.send([(CHANNEL, "late")])
    assert heard.within(ARRIVES) == ["late"]
    assert stalled
    assert notifier.connects == 2


def test_a_notifier_that_cannot_be_reached_never_fails_the_commit(
    clean: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The hook runs after the COMMIT: an exception there would report a committed job as
    failed. It is logged, and the poll finds the job."""
    jobs = Jobs()
    jobs.register("ping", Ping)

    def unavailable(conninfo: str) -> Notifier:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(_notifier, "notifier", unavailable)
    with (
        caplog.at_level(logging.WARNING, logger="sqla_jobs.enqueue.insert"),
        Session(clean) as session,
    ):
        job_id = jobs.enqueue(session, Ping()).id
        session.commit()
    with clean.connect() as conn:
        assert conn.execute(text("SELECT id FROM sqla_jobs_job")).scalars().all() == [job_id]
    assert events(caplog, "notifier_failed") == 1


def test_a_schema_whose_channels_postgresql_cannot_name_is_refused() -> None:
    """pg_notify refuses a channel past 63 bytes, and sqla_jobs.<schema>.cancel is the longest."""
    Jobs(schema="s" * 46)
    with pytest.raises(ConfigurationError, match="at most 46 characters"):
        Jobs(schema="s" * 47)
