"""Reads on a replica: the dashboard's pages, ``stats``, ``jobs list/show`` and ``queues`` on a
real hot standby streaming from its primary (:mod:`._replica_pair`), while every action writes on the
primary.

Which server served a read is proven two ways: by ``pg_stat_activity`` on each server (the
dashboard's pooled connections, named by ``application_name``), and by pausing the standby's
replay (``pg_wal_replay_pause()``) so that what the primary has and the standby does not tells
them apart.
"""

from __future__ import annotations

import html
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from sqla_jobs.cli.entry import main
from sqla_jobs.dashboard._replica import COOKIE
from sqla_jobs.db.replica import ReplicaConflictError, retrying_conflicts
from sqla_jobs.db.urls import sqlalchemy_url
from tests.conftest import alembic_config
from tests.integration._dashboard import add_jobs, dashboard, make_jobs, post, set_state, state_of

from ._ports import free_port
from ._replica_pair import Pair, streaming_pair

DB = "sqla_jobs_replicas"
_STATE = re.compile(r'<span class="state state-(\w+)">')


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    # Feedback keeps vacuum on the primary from cancelling the standby's reads (snapshot
    # conflicts); the conflict test brings its own.
    with streaming_pair({"hot_standby_feedback": "on"}) as running:
        with running.connect("primary") as conn:
            conn.execute(f'CREATE DATABASE "{DB}"')
        command.upgrade(alembic_config(running.url("primary", DB)), "head")
        running.caught_up()
        yield running


@pytest.fixture
def primary(pair: Pair) -> Iterator[Engine]:
    """An engine on the primary's test database, its queue emptied."""
    engine = create_engine(sqlalchemy_url(pair.url("primary", DB)), poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_job"))
        conn.execute(text("DELETE FROM sqla_jobs_queue"))
    pair.caught_up()
    yield engine
    engine.dispose()


@pytest.fixture
def paused_replay(pair: Pair) -> Iterator[Any]:
    """Call it to pause the standby's replay; it is resumed at the end of the test."""

    def pause() -> None:
        with pair.connect("standby") as conn:
            conn.execute("SELECT pg_wal_replay_pause()")

    yield pause
    with pair.connect("standby") as conn:
        conn.execute("SELECT pg_wal_replay_resume()")


def sessions(pair: Pair, server: str, name: str) -> int:
    """Connections named ``name`` on ``server``."""
    with pair.connect(server) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dashboard_pages_are_read_on_the_replica_and_actions_written_on_the_primary(
    pair: Pair, primary: Engine
) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(primary, jobs)
    set_state(primary, job_id, "dead")
    pair.caught_up()
    writes = pair.url("primary", DB, application_name="rr-writes")
    reads = pair.url("standby", DB, application_name="rr-reads")
    with dashboard(writes, jobs=jobs, read_url=reads) as client:
        for path in ("/", "/jobs", f"/jobs/{job_id}", "/workers", "/throughput"):
            page = client.get(path)
            assert page.status_code == 200, page.text
            assert "Read from the replica, at WAL position" in page.text
        assert sessions(pair, "standby", "rr-reads") >= 1
        assert sessions(pair, "primary", "rr-writes") == 0
        assert sessions(pair, "primary", "rr-reads") == 0

        done = post(client, "/jobs/retry", job=str(job_id), next=f"/jobs/{job_id}")
        assert done.status_code == 303
        assert sessions(pair, "primary", "rr-writes") >= 1
        assert sessions(pair, "standby", "rr-writes") == 0
    assert state_of(primary, job_id) == ("pending", False)


def test_the_page_after_an_action_reads_its_own_change_until_the_replica_replays_it(
    pair: Pair, primary: Engine, paused_replay: Any
) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(primary, jobs)
    set_state(primary, job_id, "dead")
    pair.caught_up()
    with dashboard(pair.url("primary", DB), jobs=jobs, read_url=pair.url("standby", DB)) as client:
        paused_replay()
        done = post(client, "/jobs/retry", job=str(job_id), next=f"/jobs/{job_id}")
        assert COOKIE in done.cookies
        after = client.get(done.headers["location"])
        # The replica still has it dead: the page reads the primary, and says so.
        assert _STATE.findall(after.text) == ["pending"]
        assert "the replica has not replayed your last action yet" in after.text
        assert "Read from the primary." in after.text
        again = client.get(f"/jobs/{job_id}")
        assert _STATE.findall(again.text) == ["pending"]

        with pair.connect("standby") as conn:
            conn.execute("SELECT pg_wal_replay_resume()")
        pair.caught_up()
        caught_up = client.get(f"/jobs/{job_id}")
        assert _STATE.findall(caught_up.text) == ["pending"]
        assert "Read from the replica, at WAL position" in caught_up.text
        assert "not replayed your last action" not in caught_up.text
        # The mark is dropped once the replica has passed it.
        assert COOKIE not in client.cookies


def test_a_read_url_that_points_at_the_primary_works(
    pair: Pair, primary: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = make_jobs()
    (job_id,) = add_jobs(primary, jobs)
    set_state(primary, job_id, "dead")
    url = pair.url("primary", DB)
    with dashboard(url, jobs=jobs, read_url=url) as client:
        page = client.get(f"/jobs/{job_id}")
        assert "Read from the read URL's server (a primary)" in html.unescape(page.text)
        done = post(client, "/jobs/retry", job=str(job_id), next=f"/jobs/{job_id}")
        after = client.get(done.headers["location"])
        assert _STATE.findall(after.text) == ["pending"]
        assert "not replayed your last action" not in after.text
    code, out, _ = cli(capsys, "jobs", "show", str(job_id), "--read-url", url)
    assert code == 0
    assert "pending" in out


def test_a_multi_host_read_url_with_prefer_standby_reads_the_standby_listed_second(
    pair: Pair,
    primary: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psycopg before 3.2.6 took the first host that answered, here the primary (#1021)."""
    jobs = make_jobs()
    (job_id,) = add_jobs(primary, jobs)
    pair.caught_up()
    hosts = f"host=127.0.0.1:{pair.primary_port}&host=127.0.0.1:{pair.standby_port}"
    reads = (
        f"postgresql+psycopg://postgres@/{DB}?{hosts}"
        "&target_session_attrs=prefer-standby&application_name=rr-prefer"
    )
    with dashboard(pair.url("primary", DB), jobs=jobs, read_url=reads) as client:
        page = client.get(f"/jobs/{job_id}")
        assert "Read from the replica, at WAL position" in page.text
        assert sessions(pair, "standby", "rr-prefer") >= 1
        assert sessions(pair, "primary", "rr-prefer") == 0
    monkeypatch.setenv("DATABASE_URL", pair.url("primary", DB))
    code, out, err = cli(capsys, "stats", "--json", "--read-url", reads)
    assert code == 0, err
    assert '"queues": "replica"' in out


def test_an_unreachable_read_url_is_a_clear_page_not_a_traceback(
    pair: Pair, primary: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/{DB}?connect_timeout=2"
    with dashboard(pair.url("primary", DB), jobs=make_jobs(), read_url=nowhere) as client:
        page = client.get("/")
    assert page.status_code == 503
    assert "Replica unavailable" in page.text
    assert "cannot reach the read replica at postgresql://postgres@127.0.0.1:" in page.text
    assert not [r for r in caplog.records if r.exc_info]


def test_cli_listings_read_the_replica_and_actions_ignore_the_read_url(
    pair: Pair,
    primary: Engine,
    paused_replay: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = make_jobs()
    (old,) = add_jobs(primary, jobs)
    set_state(primary, old, "dead")
    pair.caught_up()
    paused_replay()
    (new,) = add_jobs(primary, jobs)
    monkeypatch.setenv("DATABASE_URL", pair.url("primary", DB))
    replica = pair.url("standby", DB)

    code, out, _ = cli(capsys, "jobs", "list", "--json", "--read-url", replica)
    assert code == 0
    assert [f'"id": {old}' in line for line in out.splitlines()] == [True]
    code, out, _ = cli(capsys, "jobs", "list", "--json")
    assert code == 0
    assert len(out.splitlines()) == 2

    monkeypatch.setenv("SQLA_JOBS_READ_URL", replica)
    code, _, err = cli(capsys, "jobs", "show", str(new))
    assert code == 6
    assert f"no job with id {new}" in err
    code, out, _ = cli(capsys, "queues", "--json")
    assert code == 0
    assert '"pending": 0' in out
    assert '"dead": 1' in out
    code, out, _ = cli(capsys, "stats")
    assert code == 0
    lag = re.search(r"\(counts read from the replica, (\d+) bytes of WAL behind the primary\)", out)
    assert lag is not None, out
    assert int(lag.group(1)) > 0
    assert "table sqla_jobs_job (on the primary)" in out

    # Every command that writes goes to the database URL: on the standby it would be refused.
    code, out, err = cli(capsys, "jobs", "retry", str(old))
    assert code == 0, err
    code, out, err = cli(capsys, "queues", "pause", "mail")
    assert code == 0, err
    assert state_of(primary, old) == ("pending", False)


def test_cli_stats_on_a_replica_alone_labels_what_it_read_there(
    pair: Pair, primary: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    code, out, err = cli(capsys, "stats", "--json", "--read-url", pair.url("standby", DB))
    assert code == 0, err
    assert '"read_from": {"queues": "replica", "table": "replica"}' in out
    assert '"lag_bytes": null' in out


def test_cli_stats_with_the_primary_down_reads_the_replica_alone_and_says_so(
    pair: Pair, primary: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moment an operator reaches for the replica is when the primary is down: ``stats``
    then counts on the replica, says in one line that the primary did not answer, and exits 0."""
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/{DB}?connect_timeout=2"
    monkeypatch.setenv("DATABASE_URL", nowhere)
    code, out, err = cli(capsys, "stats", "--json", "--read-url", pair.url("standby", DB))
    assert code == 0, err
    assert '"read_from": {"queues": "replica", "table": "replica"}' in out
    assert err.startswith("sqla-jobs: warning: cannot reach the database at "), err
    assert "reading the replica alone" in err
    assert len(err.strip().splitlines()) == 1, err


def test_an_unreachable_read_url_is_one_line_in_the_cli(
    pair: Pair, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", pair.url("primary", DB))
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/{DB}?connect_timeout=2"
    for argv in (["jobs", "list"], ["jobs", "show", "1"], ["queues"], ["stats"]):
        code, _out, err = cli(capsys, *argv, "--read-url", nowhere)
        assert code == 3, (argv, err)
        assert err.startswith(
            "sqla-jobs: error: cannot reach the read replica (--read-url or SQLA_JOBS_READ_URL) "
            "at postgresql://postgres@127.0.0.1:"
        ), err
        assert "Traceback" not in err
        assert len(err.strip().splitlines()) == 1


def test_a_read_cancelled_by_a_recovery_conflict_runs_once_more_then_is_reported(
    pair: Pair, primary: Engine
) -> None:
    with pair.connect("standby") as conn:
        conn.execute("ALTER SYSTEM SET max_standby_streaming_delay = 0")
        conn.execute("SELECT pg_reload_conf()")
    replica = create_engine(
        sqlalchemy_url(pair.url("standby", DB, application_name="rr-conflict")), poolclass=NullPool
    )
    try:
        _wait_for_setting(pair, "max_standby_streaming_delay", "0")
        runs: list[str] = []

        def read(conflicts: int) -> Any:
            def once() -> Any:
                runs.append("run")
                with replica.connect() as conn:
                    if len(runs) <= conflicts:
                        locker = threading.Thread(target=_lock_when_sleeping, args=(pair,))
                        locker.start()
                        try:
                            conn.execute(
                                text("SELECT pg_sleep(30), (SELECT count(*) FROM sqla_jobs_job)")
                            )
                        finally:
                            locker.join()
                    return conn.execute(text("SELECT count(*) FROM sqla_jobs_job")).scalar()

            return once

        assert retrying_conflicts(read(1), "the replica") == 0
        assert len(runs) == 2
        runs.clear()
        with pytest.raises(ReplicaConflictError, match="the replica cancelled this read twice"):
            retrying_conflicts(read(2), "the replica")
        assert len(runs) == 2
    finally:
        replica.dispose()
        with pair.connect("standby") as conn:
            conn.execute("ALTER SYSTEM RESET max_standby_streaming_delay")
            conn.execute("SELECT pg_reload_conf()")


def _wait_for_setting(pair: Pair, name: str, value: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        with pair.connect("standby") as conn:
            row = conn.execute(f"SHOW {name}").fetchone()
        if row is not None and row[0] == value:
            return
        assert time.monotonic() < deadline, f"{name} never became {value}"
        time.sleep(0.05)


def _lock_when_sleeping(pair: Pair) -> None:
    """Once the standby's read sleeps holding its lock, take an ACCESS EXCLUSIVE lock on the
    job table on the primary: replaying it cancels that read (a recovery conflict)."""
    deadline = time.monotonic() + 30
    with pair.connect("standby") as standby:
        while True:
            row = standby.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rr-conflict' "
                "AND wait_event = 'PgSleep'"
            ).fetchone()
            if row is not None and row[0]:
                break
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
    with pair.connect("primary", DB) as conn, conn.transaction():
        conn.execute("LOCK TABLE sqla_jobs_job IN ACCESS EXCLUSIVE MODE")


def test_with_the_primary_gone_the_page_after_an_action_says_the_replica_is_behind() -> None:
    with streaming_pair() as own:
        with own.connect("primary") as conn:
            conn.execute(f'CREATE DATABASE "{DB}"')
        command.upgrade(alembic_config(own.url("primary", DB)), "head")
        writes = create_engine(sqlalchemy_url(own.url("primary", DB)), poolclass=NullPool)
        jobs = make_jobs()
        (job_id,) = add_jobs(writes, jobs)
        set_state(writes, job_id, "dead")
        writes.dispose()
        own.caught_up()
        with dashboard(
            own.url("primary", DB), jobs=jobs, read_url=own.url("standby", DB)
        ) as client:
            with own.connect("standby") as conn:
                conn.execute("SELECT pg_wal_replay_pause()")
            done = post(client, "/jobs/retry", job=str(job_id), next=f"/jobs/{job_id}")
            own.run("pg_ctl", "-D", "primary", "-m", "fast", "-w", "stop")
            after = client.get(done.headers["location"])
        assert after.status_code == 200
        assert _STATE.findall(after.text) == ["dead"]
        assert "the primary cannot be reached" in after.text
        assert "Read from the replica, at WAL position" in after.text
