"""``sqla-jobs schedules ...`` as an operator runs it, and ``sqla-jobs worker --no-schedules``: what
the commands print, their exit codes, and what they write to ``sqla_jobs_schedule`` and the queue.

The application is :mod:`tests.acceptance.schedules_app`: a daily report at 09:00 in Paris
(``paris-report``) and an hourly ``sweep``.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine, text

from tests._waiting import wait_until
from tests.acceptance._processes import DEADLINE, WorkerProcess, run_cli
from tests.acceptance.schedules_app import PARIS_REPORT, SWEEP
from tests.acceptance.test_cli import assert_one_line_error

APP = "tests.acceptance.schedules_app:jobs"
UTC = timezone.utc
PARIS = ZoneInfo("Europe/Paris")
HEADER = ["name", "kind", "schedule", "next tick (UTC)", "last tick (UTC)", "last job"]
DECLARED = [
    (PARIS_REPORT, "report", "cron 0 9 * * * Europe/Paris"),
    (SWEEP, "sweep", "every 3600s"),
]


@pytest.fixture
def fresh(clean: Engine) -> Engine:
    """The engine, with no job and no schedule state: as before any worker ever ran."""
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_schedule"))
    return clean


def cli(url: str, *args: str) -> Any:
    return run_cli(*args, database_url=url)


def execute(engine: Engine, sql: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params)


def rows(engine: Engine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def schedule_rows(engine: Engine) -> list[tuple[Any, ...]]:
    """Every ``sqla_jobs_schedule`` row: name, kind, spec, last_tick_at, paused_at, seen_at."""
    return rows(
        engine,
        "SELECT name, kind, spec, last_tick_at, paused_at, seen_at FROM sqla_jobs_schedule "
        "ORDER BY name",
    )


def snapshot(engine: Engine) -> list[tuple[Any, ...]]:
    """Every job and every schedule row, whole."""
    jobs = rows(engine, "SELECT * FROM sqla_jobs_job ORDER BY id")
    return jobs + rows(engine, "SELECT * FROM sqla_jobs_schedule ORDER BY name")


def table(stdout: str) -> dict[str, list[str]]:
    """The table ``sqla-jobs schedules`` prints, by schedule name (columns split on 2+ spaces)."""
    header, *lines = stdout.splitlines()
    assert re.split(r"\s{2,}", header) == HEADER
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", line) for line in lines)}


def listed(url: str) -> dict[str, dict[str, Any]]:
    """``sqla-jobs schedules list APP --json``, by schedule name."""
    result = cli(url, "schedules", "list", APP, "--json")
    assert result.returncode == 0, result.stderr
    return {s["name"]: s for s in map(json.loads, result.stdout.splitlines())}


def utc(value: str) -> datetime:
    """A time as the table prints it (UTC, to the second)."""
    return datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def assert_next_ticks(paris_next: datetime, sweep_next: datetime) -> None:
    """The report's next tick is the next 09:00 in Paris, the sweep's the next full hour (UTC)."""
    now = datetime.now(UTC)
    local = paris_next.astimezone(PARIS)
    assert (local.hour, local.minute, local.second) == (9, 0, 0), paris_next
    assert now - timedelta(seconds=5) < paris_next <= now + timedelta(hours=25)
    assert (sweep_next.minute, sweep_next.second, sweep_next.microsecond) == (0, 0, 0)
    assert now - timedelta(seconds=5) < sweep_next <= now + timedelta(hours=1)


def test_schedules_lists_the_declared_schedules_before_any_worker_ran_and_writes_nothing(
    fresh: Engine, migrated_url: str
) -> None:
    """``schedules APP`` is ``schedules list APP``: one line per declared schedule, with its kind,
    spec and next tick, though no worker has recorded anything yet; ``--json`` says the same."""
    default = cli(migrated_url, "schedules", APP)
    explicit = cli(migrated_url, "schedules", "list", APP)
    assert (default.returncode, explicit.returncode) == (0, 0), default.stderr + explicit.stderr
    for result in (default, explicit):
        shown = table(result.stdout)
        assert [tuple(shown[name][:3]) for name in sorted(shown)] == DECLARED
        assert [shown[name][4:] for name in sorted(shown)] == [["-", "-"], ["-", "-"]]
        assert_next_ticks(utc(shown[PARIS_REPORT][3]), utc(shown[SWEEP][3]))

    as_json = listed(migrated_url)
    assert [(s["name"], s["kind"], s["schedule"]) for s in as_json.values()] == DECLARED
    for s in as_json.values():
        assert s["in_code"] is True
        assert s["paused_at"] is s["last_tick_at"] is s["last_job_id"] is s["seen_at"] is None
    paris_next = datetime.fromisoformat(as_json[PARIS_REPORT]["next_tick_at"])
    assert_next_ticks(paris_next, datetime.fromisoformat(as_json[SWEEP]["next_tick_at"]))
    assert schedule_rows(fresh) == [], "a listing records nothing"


def test_options_may_come_before_the_app(fresh: Engine, migrated_url: str) -> None:
    """``schedules --json APP`` and ``schedules --database-url URL APP`` list as
    ``schedules list ...`` does: the implied ``list`` goes before the options."""
    for args in (("--json", APP), ("--database-url", migrated_url, "--json", APP)):
        before = cli(migrated_url, "schedules", "list", APP, "--json")
        result = cli(migrated_url, "schedules", *args)
        after = cli(migrated_url, "schedules", "list", APP, "--json")
        assert result.returncode == 0, result.stderr
        # The hourly schedule's next tick moves on if an hour starts between two calls: the
        # listing must equal the explicit one's on one side of it.
        assert result.stdout in (before.stdout, after.stdout), (result.stdout, before.stdout)


def test_schedules_of_an_application_without_any_says_so_and_its_json_is_no_lines(
    fresh: Engine, migrated_url: str
) -> None:
    """An application with no ``@jobs.periodic``: a hint in the table, nothing at all in JSON."""
    plain = cli(migrated_url, "schedules", "tests.acceptance.app:jobs")
    assert (plain.returncode, plain.stdout) == (
        0,
        "(no schedules: declare one with @jobs.periodic)\n",
    )
    as_json = cli(migrated_url, "schedules", "tests.acceptance.app:jobs", "--json")
    assert (as_json.returncode, as_json.stdout) == (0, ""), as_json.stderr


def test_pause_holds_a_schedule_and_resume_lets_it_tick_again(
    fresh: Engine, migrated_url: str
) -> None:
    """A paused schedule is listed as paused since when, with no next tick; a second pause keeps
    the first time; the other schedule is untouched; resume clears the pause."""
    paused = cli(migrated_url, "schedules", "pause", APP, SWEEP)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout == f"paused schedule {SWEEP}: no tick is enqueued until it is resumed\n"
    ((name, kind, spec, _last, paused_at, _seen),) = schedule_rows(fresh)
    assert (name, kind, spec) == DECLARED[1]
    assert paused_at is not None
    assert abs(datetime.now(UTC) - paused_at) < timedelta(seconds=15)
    assert cli(migrated_url, "schedules", "pause", APP, SWEEP).returncode == 0
    assert schedule_rows(fresh)[0][4] == paused_at, "a second pause keeps the first time"

    shown = table(cli(migrated_url, "schedules", APP).stdout)
    since = f"{paused_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
    held = re.fullmatch(
        rf"paused since {since} \(if resumed now, next tick (.+)\)", shown[SWEEP][3]
    )
    assert held is not None, shown[SWEEP][3]
    assert not shown[PARIS_REPORT][3].startswith("paused")
    as_json = listed(migrated_url)
    assert datetime.fromisoformat(as_json[SWEEP]["paused_at"]) == paused_at
    assert as_json[SWEEP]["next_tick_at"] is None, "a paused schedule has no next tick"
    if_resumed = datetime.fromisoformat(as_json[SWEEP]["next_tick_if_resumed_at"])
    assert utc(held[1]) == if_resumed.replace(microsecond=0)
    assert_next_ticks(datetime.fromisoformat(as_json[PARIS_REPORT]["next_tick_at"]), if_resumed)
    assert as_json[PARIS_REPORT]["paused_at"] is None
    assert as_json[PARIS_REPORT]["next_tick_if_resumed_at"] is None, "it is not paused"

    resumed = cli(migrated_url, "schedules", "resume", APP, SWEEP)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"resumed schedule {SWEEP}: it ticks again")
    assert schedule_rows(fresh)[0][4] is None
    after = listed(migrated_url)
    assert after[SWEEP]["paused_at"] is None
    paris_next = datetime.fromisoformat(after[PARIS_REPORT]["next_tick_at"])
    assert_next_ticks(paris_next, datetime.fromisoformat(after[SWEEP]["next_tick_at"]))


def test_a_last_job_whose_row_is_gone_is_listed_as_gone_without_guessing_why(
    fresh: Engine, migrated_url: str
) -> None:
    """A last job still in the job table is listed with its state; one whose row is gone may have
    completed (and been deleted or moved to history), or ended and been pruned or deleted: the
    listing says it is gone and names every way it could be, in the table and in ``--json``."""
    with fresh.begin() as conn:
        job_id = conn.execute(
            text(
                "INSERT INTO sqla_jobs_job (queue, kind, payload) "
                "VALUES ('reports', 'report', '{}') RETURNING id"
            )
        ).scalar_one()
    tick = datetime(2024, 6, 1, 7, 0, tzinfo=UTC)
    for name, kind, spec, last_job in (
        (*DECLARED[0], job_id),
        (*DECLARED[1], job_id + 1000),
    ):
        execute(
            fresh,
            "INSERT INTO sqla_jobs_schedule (name, kind, spec, last_tick_at, last_job_id) "
            "VALUES (:name, :kind, :spec, :tick, :job)",
            name=name,
            kind=kind,
            spec=spec,
            tick=tick,
            job=last_job,
        )

    shown = table(cli(migrated_url, "schedules", APP).stdout)
    assert shown[PARIS_REPORT][5] == f"{job_id} pending"
    assert shown[SWEEP][5] == f"{job_id + 1000} gone (completed, pruned or deleted)"
    as_json = listed(migrated_url)
    assert (as_json[PARIS_REPORT]["last_job_state"], as_json[PARIS_REPORT]["last_job_gone"]) == (
        "pending",
        False,
    )
    assert (as_json[SWEEP]["last_job_id"], as_json[SWEEP]["last_job_state"]) == (
        job_id + 1000,
        None,
    )
    assert as_json[SWEEP]["last_job_gone"] is True


def test_run_enqueues_one_job_of_the_schedule_now_and_leaves_its_ticks_alone(
    fresh: Engine, migrated_url: str
) -> None:
    """``schedules run`` enqueues exactly one job of the schedule's kind and queue, tagged as a
    manual run of it, without moving the schedule's last tick or adding a schedule row."""
    last_tick = datetime(2024, 6, 1, 10, 0, tzinfo=UTC)
    execute(
        fresh,
        "INSERT INTO sqla_jobs_schedule (name, kind, spec, last_tick_at) "
        "VALUES (:name, 'sweep', 'every 3600s', :tick)",
        name=SWEEP,
        tick=last_tick,
    )
    before = schedule_rows(fresh)

    result = cli(migrated_url, "schedules", "run", APP, SWEEP)
    assert result.returncode == 0, result.stderr
    ((job_id, kind, queue, state, meta, payload),) = rows(
        fresh, "SELECT id, kind, queue, state, meta, payload FROM sqla_jobs_job"
    )
    assert result.stdout == (
        f"enqueued job {job_id} of schedule {SWEEP} to run now (its ticks are unchanged)\n"
    )
    assert (kind, queue, state, payload) == (
        "sweep",
        "maintenance",
        "pending",
        {"older_than_days": 30},
    )
    assert {k: meta[k] for k in ("manual", "schedule")} == {"manual": True, "schedule": SWEEP}
    assert schedule_rows(fresh) == before
    assert before[0][3] == last_tick
    assert datetime.fromisoformat(listed(migrated_url)[SWEEP]["last_tick_at"]) == last_tick

    other = cli(migrated_url, "schedules", "run", APP, PARIS_REPORT)
    assert other.returncode == 0, other.stderr
    assert rows(fresh, "SELECT kind, queue FROM sqla_jobs_job ORDER BY id") == [
        ("sweep", "maintenance"),
        ("report", "reports"),
    ]
    assert schedule_rows(fresh) == before, "running a schedule never records a tick"


@pytest.mark.parametrize("command", ["run", "pause", "resume"])
def test_an_unknown_schedule_name_exits_6_naming_the_declared_ones_and_writes_nothing(
    fresh: Engine, migrated_url: str, command: str
) -> None:
    """A typo in NAME is one line naming the schedules the application declares; exit code 6."""
    execute(
        fresh, "INSERT INTO sqla_jobs_schedule (name, kind, spec) VALUES ('sweep', 'sweep', 'x')"
    )
    before = snapshot(fresh)
    result = cli(migrated_url, "schedules", command, APP, "nightly")
    assert result.returncode == 6
    assert_one_line_error(
        result.stderr,
        "no schedule named 'nightly' is declared",
        f"(declared: {PARIS_REPORT}, {SWEEP})",
    )
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert snapshot(fresh) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tests.acceptance.nowhere:jobs"], "cannot import module 'tests.acceptance.nowhere'"),
        (["list", "tests.acceptance.schedules_app:nope"], "has no attribute 'nope'"),
        (["tests.acceptance.schedules_app", "--json"], "expected MODULE:ATTR"),
        (["pause", "tests.acceptance.schedules_app:Report", SWEEP], "not a sqla_jobs.Jobs"),
        (["run", "tests.acceptance.nowhere:jobs", SWEEP], "cannot import module"),
    ],
    ids=["no-module", "no-attribute", "no-colon", "not-jobs", "run-no-module"],
)
def test_a_bad_app_is_a_one_line_usage_error_without_a_traceback(
    fresh: Engine, migrated_url: str, args: list[str], fragment: str
) -> None:
    """A mistyped ``MODULE:ATTR`` exits 2 with one line saying what is wrong, and writes nothing."""
    result = cli(migrated_url, "schedules", *args)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, fragment)
    assert "Traceback" not in result.stderr
    assert snapshot(fresh) == []


def test_worker_help_documents_no_schedules(migrated_url: str) -> None:
    """``sqla-jobs worker --help`` offers ``--no-schedules`` and its environment variable."""
    result = cli(migrated_url, "worker", "--help")
    assert result.returncode == 0, result.stderr
    assert "--no-schedules" in result.stdout
    assert "SQLA_JOBS_SCHEDULES=0" in result.stdout


def stop(worker: WorkerProcess) -> None:
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(DEADLINE) == 0, worker.log


def test_a_worker_registers_the_schedules_unless_run_with_no_schedules(
    fresh: Engine, spawn_worker: Callable[..., WorkerProcess]
) -> None:
    """A worker with ``--no-schedules`` runs no scheduler and writes no schedule row; a worker
    without it records every declared schedule in ``sqla_jobs_schedule``."""
    opted_out = spawn_worker("--no-schedules", "--poll-interval", "0.2", target=APP)
    opted_out.wait_logged("started")
    assert "schedules=0" in opted_out.log
    stop(opted_out)
    assert schedule_rows(fresh) == []

    scheduling = spawn_worker("--poll-interval", "0.2", target=APP)
    scheduling.wait_logged("started")
    assert "schedules=2" in scheduling.log
    wait_until(
        lambda: [r[:3] for r in schedule_rows(fresh)] == DECLARED, "the schedules are registered"
    )
    assert all(r[5] is not None for r in schedule_rows(fresh)), "seen_at is set"
    stop(scheduling)
