"""``sqla-jobs jobs ...`` and ``sqla-jobs queues ...`` as an operator runs them, without workers:
what they print, their exit codes, and that a refused command changes nothing."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.acceptance._processes import run_cli
from tests.acceptance.ops_app import jobs
from tests.acceptance.test_cli import assert_one_line_error


def enqueue(engine: Engine, *tags: str, queue: str | None = None, kind: str = "note") -> list[int]:
    with Session(engine) as session:
        ids = [jobs.enqueue(session, kind, {"tag": t}, queue=queue).id for t in tags]
        session.commit()
    return ids


def execute(engine: Engine, sql: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params)


def snapshot(engine: Engine) -> list[tuple[Any, ...]]:
    """Every job's id, state, run_at, attempts and cancel request, and every queue's pause."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, state, run_at, attempts, cancel_requested_at, finished_at "
                "FROM sqla_jobs_job ORDER BY id"
            )
        ).all()
        queues = conn.execute(text("SELECT * FROM sqla_jobs_queue ORDER BY queue")).all()
    return [tuple(r) for r in rows] + [tuple(q) for q in queues]


def make_dead(engine: Engine, job_id: int, error: str = "RuntimeError: boom") -> None:
    execute(
        engine,
        "UPDATE sqla_jobs_job SET state = 'dead', attempts = 1, last_error = :error, "
        "finished_at = now(), errors = CAST(:errors AS jsonb) WHERE id = :id",
        id=job_id,
        error=error,
        errors=json.dumps(
            [
                {
                    "attempt": 1,
                    "at": "2024-06-01T10:00:00+00:00",
                    "error": "RuntimeError",
                    "message": "boom",
                    "traceback": 'Traceback (most recent call last):\n  File "x.py"\nRuntimeError',
                }
            ]
        ),
    )


def make_running(engine: Engine, job_id: int) -> None:
    execute(
        engine,
        "UPDATE sqla_jobs_job SET state = 'running', attempts = 1, lease_token = "
        "gen_random_uuid(), lease_expires_at = now() + interval '1 minute', locked_by = 'w' "
        "WHERE id = :id",
        id=job_id,
    )


def cli(url: str, *args: str) -> Any:
    return run_cli(*args, database_url=url)


def test_jobs_list_shows_jobs_newest_first_filtered_by_state_queue_kind_and_meta(
    ops_effects: Engine, migrated_url: str
) -> None:
    a, b, c = enqueue(ops_effects, "a", "b", "c")
    (d,) = enqueue(ops_effects, "d", queue="other")
    make_dead(ops_effects, b)
    execute(
        ops_effects,
        'UPDATE sqla_jobs_job SET meta = \'{"tenant": "acme", "n": 7}\' WHERE id = :id',
        id=c,
    )

    everything = cli(migrated_url, "jobs", "list")
    assert everything.returncode == 0, everything.stderr
    lines = everything.stdout.splitlines()
    assert lines[0].split()[:5] == ["id", "queue", "kind", "state", "attempts"]
    assert [int(line.split()[0]) for line in lines[1:]] == [d, c, b, a]
    assert "RuntimeError: boom" in lines[3]

    def ids(*args: str) -> list[int]:
        result = cli(migrated_url, "jobs", "list", "--json", *args)
        assert result.returncode == 0, result.stderr
        return [json.loads(line)["id"] for line in result.stdout.splitlines()]

    assert ids("--state", "dead") == [b]
    assert ids("--state", "dead,pending", "--queue", "ops") == [c, b, a]
    assert ids("--queue", "other") == [d]
    assert ids("--kind", "spin") == []
    assert ids("--meta", "tenant=acme") == [c]
    assert ids("--meta", "n:=7", "--meta", "tenant=acme") == [c]
    assert ids("--meta", "n=7") == [], "KEY=VALUE matches the string '7', not the number"
    assert ids("--limit", "2") == [d, c]


def test_jobs_list_never_shows_a_payload(ops_effects: Engine, migrated_url: str) -> None:
    enqueue(ops_effects, "secret-payload-value")
    for args in ([], ["--json"]):
        result = cli(migrated_url, "jobs", "list", *args)
        assert result.returncode == 0, result.stderr
        assert "secret-payload-value" not in result.stdout
    (line,) = cli(migrated_url, "jobs", "list", "--json").stdout.splitlines()
    assert "payload" not in json.loads(line)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--state", "finished"], "invalid state 'finished'"),
        (["--queue", "no spaces"], "invalid queue name 'no spaces'"),
        (["--kind", ""], "invalid kind name ''"),
        (["--meta", "tenant"], "invalid --meta 'tenant'"),
        (["--meta", "n:={"], "must be JSON"),
        (["--limit", "0"], "invalid --limit '0'"),
        (["--limit", "ten"], "invalid --limit 'ten'"),
    ],
    ids=["state", "queue", "kind", "meta-form", "meta-json", "limit-zero", "limit-word"],
)
def test_jobs_list_with_a_bad_filter_exits_2_with_a_one_line_error(
    ops_effects: Engine, migrated_url: str, args: list[str], fragment: str
) -> None:
    result = cli(migrated_url, "jobs", "list", *args)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, fragment)
    assert result.stdout == ""


def test_jobs_show_prints_state_counters_times_errors_and_meta_but_the_payload_only_on_request(
    ops_effects: Engine, migrated_url: str
) -> None:
    (job_id,) = enqueue(ops_effects, "the-payload")
    make_dead(ops_effects, job_id)
    execute(
        ops_effects,
        'UPDATE sqla_jobs_job SET meta = \'{"tenant": "acme"}\', '
        "steps = '{\"charge\": 1}' WHERE id = :id",
        id=job_id,
    )

    shown = cli(migrated_url, "jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.splitlines()[0] == f"job {job_id}: note in queue ops, dead"
    assert "attempts       1 of 10 (crashes 0 of 3, interruptions 0)" in out
    assert "last_error     RuntimeError: boom" in out
    assert 'meta           {"tenant": "acme"}' in out
    assert "steps          charge" in out
    assert "attempt 1 at 2024-06-01T10:00:00+00:00: RuntimeError: boom" in out
    assert "finished_at    -" not in out
    assert "the-payload" not in out
    assert "Traceback" not in out

    full = cli(migrated_url, "jobs", "show", str(job_id), "--payload", "--traceback").stdout
    assert 'payload        {"tag": "the-payload"}' in full
    assert "Traceback (most recent call last):" in full

    as_json = json.loads(cli(migrated_url, "jobs", "show", str(job_id), "--json").stdout)
    assert as_json["state"] == "dead"
    assert as_json["errors"][0]["traceback"].startswith("Traceback")
    assert as_json["finished_at"] is not None
    assert "payload" not in as_json
    with_payload = cli(migrated_url, "jobs", "show", str(job_id), "--json", "--payload")
    assert json.loads(with_payload.stdout)["payload"] == {"tag": "the-payload"}


def test_jobs_show_of_an_unknown_id_exits_6(ops_effects: Engine, migrated_url: str) -> None:
    result = cli(migrated_url, "jobs", "show", "424242")
    assert result.returncode == 6
    assert_one_line_error(result.stderr, "no job with id 424242")


def test_jobs_retry_by_id_prints_the_ids_and_makes_them_pending(
    ops_effects: Engine, migrated_url: str
) -> None:
    ids = enqueue(ops_effects, "a", "b", "c")
    for job_id in ids:
        make_dead(ops_effects, job_id)
    result = cli(migrated_url, "jobs", "retry", *map(str, ids))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"retried 3 jobs: {', '.join(map(str, ids))}\n"
    assert {row[1] for row in snapshot(ops_effects)} == {"pending"}


def test_jobs_delete_by_id_and_all_dead_deletes_only_finished_jobs_of_the_filters(
    ops_effects: Engine, migrated_url: str
) -> None:
    a, b = enqueue(ops_effects, "a", "b")
    (c,) = enqueue(ops_effects, "c", queue="other")
    (d,) = enqueue(ops_effects, "d")
    for job_id in (a, b, c):
        make_dead(ops_effects, job_id)
    by_id = cli(migrated_url, "jobs", "delete", str(a))
    assert (by_id.returncode, by_id.stdout) == (0, f"deleted 1 job: {a}\n"), by_id.stderr
    result = cli(migrated_url, "jobs", "delete", "--all-dead", "--queue", "ops", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"deleted 1 job: {b}\n"
    assert {row[0]: row[1] for row in snapshot(ops_effects)} == {c: "dead", d: "pending"}
    again = cli(migrated_url, "jobs", "delete", "--all-dead", "--queue", "ops", "--yes")
    assert (again.returncode, again.stdout) == (0, "no dead jobs to delete\n")


def test_jobs_retry_all_dead_takes_only_the_dead_jobs_of_the_filters(
    ops_effects: Engine, migrated_url: str
) -> None:
    a, b = enqueue(ops_effects, "a", "b")
    (c,) = enqueue(ops_effects, "c", queue="other")
    (d,) = enqueue(ops_effects, "d")
    for job_id in (a, b, c):
        make_dead(ops_effects, job_id)
    result = cli(
        migrated_url, "jobs", "retry", "--all-dead", "--queue", "ops", "--kind", "note", "--yes"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"retried 2 jobs: {a}, {b}\n"
    states = {row[0]: row[1] for row in snapshot(ops_effects)}
    assert states == {a: "pending", b: "pending", c: "dead", d: "pending"}
    again = cli(migrated_url, "jobs", "retry", "--all-dead", "--queue", "ops", "--yes")
    assert (again.returncode, again.stdout) == (0, "no dead jobs to retry\n")


def test_jobs_retry_of_a_job_whose_unique_key_is_taken_exits_6_and_changes_nothing(
    ops_effects: Engine, migrated_url: str
) -> None:
    with Session(ops_effects) as session:
        dead = jobs.enqueue(session, "note", {"tag": "a"}, unique_key="order-1").id
        session.commit()
    make_dead(ops_effects, dead)
    with Session(ops_effects) as session:
        holder = jobs.enqueue(session, "note", {"tag": "b"}, unique_key="order-1").id
        (other,) = [jobs.enqueue(session, "note", {"tag": "c"}).id]
        session.commit()
    make_dead(ops_effects, other)
    before = snapshot(ops_effects)

    refused = cli(migrated_url, "jobs", "retry", str(dead), str(other))
    assert refused.returncode == 6
    assert_one_line_error(
        refused.stderr, f"job {dead}'s is held by job {holder}", "nothing changed"
    )
    assert snapshot(ops_effects) == before

    by_filter = cli(migrated_url, "jobs", "retry", "--all-dead", "--yes")
    assert by_filter.returncode == 0, by_filter.stderr
    assert by_filter.stdout == (
        f"retried 1 job: {other}\n"
        f"kept 1 dead, their unique key held by another job: {dead} (held by job {holder})\n"
    )


@pytest.mark.parametrize(
    ("command", "state", "fragment"),
    [
        ("retry", "running", "cannot retry: job {id} is running"),
        ("cancel", "dead", "cannot cancel: job {id} is dead"),
        ("retry", "unknown", "no job with id 999999"),
        ("cancel", "unknown", "no job with id 999999"),
        ("delete", "running", "cannot delete: job {id} is running"),
        ("delete", "unknown", "no job with id 999999"),
    ],
    ids=[
        "retry-running",
        "cancel-dead",
        "retry-unknown",
        "cancel-unknown",
        "delete-running",
        "delete-unknown",
    ],
)
def test_retry_or_cancel_of_an_unknown_id_or_a_job_in_the_wrong_state_exits_6_and_changes_nothing(
    ops_effects: Engine, migrated_url: str, command: str, state: str, fragment: str
) -> None:
    """One bad id among good ones: the whole command is refused, the good ones untouched."""
    good, _other = enqueue(ops_effects, "good", "other")
    make_dead(ops_effects, good)
    target = 999999
    if state != "unknown":
        (target,) = enqueue(ops_effects, "target")
        (make_running if state == "running" else make_dead)(ops_effects, target)
    if command == "cancel":
        execute(
            ops_effects,
            "UPDATE sqla_jobs_job SET state = 'pending', finished_at = NULL, "
            "last_error = NULL, errors = NULL WHERE id = :id",
            id=good,
        )
    before = snapshot(ops_effects)
    result = cli(migrated_url, "jobs", command, str(good), str(target))
    assert result.returncode == 6
    assert_one_line_error(result.stderr, fragment.format(id=target), "nothing changed")
    assert result.stdout == ""
    assert snapshot(ops_effects) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["retry"], "give the ids of the jobs to retry, or --all-dead"),
        (["retry", "1", "--all-dead"], "not both"),
        (["retry", "1", "--kind", "note"], "with ids, give only ids"),
        (["retry", "--all-dead", "--queue", "a b"], "invalid queue name 'a b'"),
        (["retry", "seven"], "invalid job id 'seven'"),
        (["cancel"], "give the ids of the jobs to cancel, or --queue"),
        (["cancel", "1", "--queue", "ops"], "not both"),
        (["cancel", "-3"], "invalid job id '-3'"),
        (["show", "x"], "invalid job id 'x'"),
        (["delete"], "give the ids of the jobs to delete, or --all-dead"),
        (["delete", "1", "--all-dead"], "not both"),
        (["delete", "--all-dead", "--kind", "a b"], "invalid kind name 'a b'"),
    ],
)
def test_jobs_commands_with_bad_arguments_exit_2_with_a_one_line_error_and_change_nothing(
    ops_effects: Engine, migrated_url: str, args: list[str], fragment: str
) -> None:
    (job_id,) = enqueue(ops_effects, "a")
    make_dead(ops_effects, job_id)
    before = snapshot(ops_effects)
    result = cli(migrated_url, "jobs", *args)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, fragment)
    assert snapshot(ops_effects) == before


def test_jobs_cancel_cancels_pending_jobs_and_asks_the_workers_of_running_ones(
    ops_effects: Engine, migrated_url: str
) -> None:
    a, b, c = enqueue(ops_effects, "a", "b", "c")
    make_running(ops_effects, c)
    result = cli(migrated_url, "jobs", "cancel", str(a), str(b), str(c))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"cancelled 2 pending jobs: {a}, {b}",
        f"asked the workers to stop 1 running job: {c}"
        " (an async handler is cancelled at once and the job ends cancelled; a sync handler is "
        "told through ctx.cancelled: its job ends cancelled if it stops by raising, and completes "
        "if it returns)",
    ]
    rows = {row[0]: row for row in snapshot(ops_effects)}
    assert rows[a][1] == rows[b][1] == "cancelled"
    assert rows[c][1] == "running"
    assert rows[c][4] is not None, "the cancel request is stored with the running job"


def test_jobs_cancel_by_queue_and_kind_leaves_other_queues_and_kinds_alone(
    ops_effects: Engine, migrated_url: str
) -> None:
    a, b = enqueue(ops_effects, "a", "b")
    (c,) = enqueue(ops_effects, "c", kind="spin")
    (d,) = enqueue(ops_effects, "d", queue="other")
    result = cli(migrated_url, "jobs", "cancel", "--queue", "ops", "--kind", "note", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"cancelled 2 pending jobs: {a}, {b}\n"
    states = {row[0]: row[1] for row in snapshot(ops_effects)}
    assert states == {a: "cancelled", b: "cancelled", c: "pending", d: "pending"}
    none = cli(migrated_url, "jobs", "cancel", "--queue", "empty", "--yes")
    assert (none.returncode, none.stdout) == (0, "no pending or running jobs to cancel\n")


def age_seconds(shown: str) -> float:
    """An age as the listings show it (``sqla_jobs.observe.stats``: 95.0s, 2.1m, 1.5h)."""
    return float(shown[:-1]) * {"s": 1, "m": 60, "h": 3600}[shown[-1]]


def test_queues_lists_depth_by_state_latency_and_pauses_including_queues_without_jobs(
    ops_effects: Engine, migrated_url: str
) -> None:
    a, _b = enqueue(ops_effects, "a", "b")
    make_dead(ops_effects, a)
    backdated = time.monotonic()
    execute(
        ops_effects,
        "UPDATE sqla_jobs_job SET run_at = now() - interval '90 seconds' WHERE state = 'pending'",
    )
    paused = cli(migrated_url, "queues", "pause", "archive", "--new")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("paused queue archive")
    # Live workers serving a queue are counted there, a stale one not; a queue only a worker
    # serves is listed too.
    execute(ops_effects, "DELETE FROM sqla_jobs_worker")
    for name, queues, expires in (
        ("w1", "{ops,idle}", "1 minute"),
        ("w2", "{ops}", "1 minute"),
        ("gone", "{ops}", "-1 minute"),
    ):
        execute(
            ops_effects,
            "INSERT INTO sqla_jobs_worker (name, host, pid, queues, concurrency, expires_at) "
            "VALUES (:name, 'h', 1, CAST(:queues AS text[]), 4, now() + CAST(:expires AS interval))",
            name=name,
            queues=queues,
            expires=expires,
        )

    table = cli(migrated_url, "queues")
    # The commands' start-up counts in the age (seconds on a loaded machine).
    since = time.monotonic() - backdated
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "queue",
        "pending",
        "running",
        "dead",
        "completed",
        "cancelled",
        "waiting",
        "workers",
        "oldest",
        "due",
        "paused",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["archive"][:8] == ["0", "0", "0", "0", "0", "0", "0", "-"]
    assert rows["archive"][8] == "since"
    assert rows["ops"][:7] == ["1", "0", "1", "0", "0", "0", "2"]
    assert 90 <= age_seconds(rows["ops"][7]) <= 90 + since + 6  # the shown age is rounded
    assert rows["ops"][8] == "-"
    assert rows["idle"][:8] == ["0", "0", "0", "0", "0", "0", "1", "-"]

    as_json = {
        q["queue"]: q
        for q in map(json.loads, cli(migrated_url, "queues", "--json").stdout.splitlines())
    }
    assert as_json["archive"]["paused"] is True
    assert as_json["ops"]["paused"] is False
    assert as_json["ops"]["dead"] == 1
    assert (as_json["ops"]["workers"], as_json["ops"]["slots"]) == (2, 8)
    execute(ops_effects, "DELETE FROM sqla_jobs_worker")

    resumed = cli(migrated_url, "queues", "resume", "archive")
    assert (resumed.returncode, resumed.stdout) == (0, "resumed queue archive\n")
    again = {
        q["queue"]: q
        for q in map(json.loads, cli(migrated_url, "queues", "--json").stdout.splitlines())
    }
    assert again["archive"]["paused"] is False


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_queues_pause_or_resume_of_a_bad_name_exits_2_and_changes_nothing(
    ops_effects: Engine, migrated_url: str, command: str
) -> None:
    result = cli(migrated_url, "queues", command, "no spaces")
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "invalid queue name 'no spaces'")
    assert snapshot(ops_effects) == []


def test_queues_pause_of_a_queue_nothing_names_exits_6_naming_the_known_queues(
    ops_effects: Engine, migrated_url: str
) -> None:
    enqueue(ops_effects, "a", queue="mail")
    (running,) = enqueue(ops_effects, "b", queue="reports")
    make_running(ops_effects, running)
    before = snapshot(ops_effects)
    typo = cli(migrated_url, "queues", "pause", "alpah")
    assert typo.returncode == 6, typo.stderr
    assert_one_line_error(typo.stderr, "unknown queue 'alpah'")
    # Earlier tests in this database may have left queues of their own (their throughput rows).
    known = re.search(r"known queues: ([^)]*)\)", typo.stderr)
    assert known is not None, typo.stderr
    assert {"mail", "reports"} <= set(known.group(1).split(", ")), typo.stderr
    assert "alpah" not in known.group(1).split(", ")
    assert "--new" in typo.stderr
    assert snapshot(ops_effects) == before
    listed = cli(migrated_url, "queues", "--json")
    assert "alpah" not in listed.stdout
    intended = cli(migrated_url, "queues", "pause", "alpah", "--new")
    assert intended.returncode == 0, intended.stderr
    assert intended.stdout.startswith("paused queue alpah")
    known = cli(migrated_url, "queues", "pause", "mail")
    assert known.returncode == 0, known.stderr


def test_queues_pause_of_a_paused_queue_says_since_when_and_resume_of_an_active_one_says_so(
    ops_effects: Engine, migrated_url: str
) -> None:
    enqueue(ops_effects, "a", queue="mail")
    first = cli(migrated_url, "queues", "pause", "mail")
    assert first.stdout.startswith("paused queue mail:")
    (since,) = [q[1] for q in snapshot(ops_effects) if q[0] == "mail"]
    again = cli(migrated_url, "queues", "pause", "mail")
    assert again.returncode == 0, again.stderr
    expected = since.isoformat(sep=" ", timespec="seconds")
    assert again.stdout == f"queue mail is already paused (since {expected})\n"
    resumed = cli(migrated_url, "queues", "resume", "mail")
    assert resumed.stdout == "resumed queue mail\n"
    not_paused = cli(migrated_url, "queues", "resume", "mail")
    assert (not_paused.returncode, not_paused.stdout) == (0, "queue mail was not paused\n")


def test_queues_resume_of_a_queue_never_paused_stores_nothing(
    ops_effects: Engine, migrated_url: str
) -> None:
    result = cli(migrated_url, "queues", "resume", "alpah")
    assert (result.returncode, result.stdout) == (0, "queue alpah was not paused\n")
    assert snapshot(ops_effects) == []
    assert cli(migrated_url, "queues", "--json").stdout == ""


def test_queues_forget_deletes_a_queues_row_and_refuses_to_resume_a_paused_queue_in_use(
    ops_effects: Engine, migrated_url: str
) -> None:
    enqueue(ops_effects, "a", queue="mail")
    cli(migrated_url, "queues", "pause", "alpah", "--new")
    forgot = cli(migrated_url, "queues", "forget", "alpah")
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.startswith("forgot queue alpah")
    assert "alpah" not in cli(migrated_url, "queues", "--json").stdout
    nothing = cli(migrated_url, "queues", "forget", "alpah")
    assert nothing.returncode == 6
    assert_one_line_error(nothing.stderr, "queue 'alpah' has no stored state: nothing to forget")

    cli(migrated_url, "queues", "pause", "mail")
    before = snapshot(ops_effects)
    in_use = cli(migrated_url, "queues", "forget", "mail")
    assert in_use.returncode == 6
    assert_one_line_error(in_use.stderr, "queue 'mail' is paused and still in use")
    assert "--force" in in_use.stderr
    assert snapshot(ops_effects) == before
    forced = cli(migrated_url, "queues", "forget", "mail", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not [q for q in snapshot(ops_effects) if q[0] == "mail"]


def test_queues_takes_the_database_url_before_or_after_the_subcommand(
    ops_effects: Engine, migrated_url: str
) -> None:
    before = run_cli(
        "queues", "--database-url", migrated_url, "pause", "q1", "--new", database_url=None
    )
    assert before.returncode == 0, before.stderr
    after = run_cli("queues", "resume", "q1", "--database-url", migrated_url, database_url=None)
    assert after.returncode == 0, after.stderr


def test_stats_json_breaks_jobs_down_per_queue_and_per_kind(
    ops_effects: Engine, migrated_url: str
) -> None:
    a, _b = enqueue(ops_effects, "a", "b")
    enqueue(ops_effects, "c", kind="spin", queue="other")
    make_dead(ops_effects, a)
    cli(migrated_url, "queues", "pause", "idle", "--new")
    result = cli(migrated_url, "stats", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["kinds"]["note"]["pending"] == 1
    assert stats["kinds"]["note"]["dead"] == 1
    assert stats["kinds"]["spin"]["pending"] == 1
    assert stats["queues"]["ops"]["dead"] == 1
    assert stats["queues"]["idle"]["paused"] is True
    assert stats["queues"]["other"]["paused"] is False
    assert "n_dead_tup" in stats["table"]
    assert stats["warnings"] == []
    text_output = cli(migrated_url, "stats")
    assert text_output.returncode == 0
    assert text_output.stdout.splitlines()[0].split()[0] == "queue"


@pytest.mark.parametrize(
    "args", [["jobs", "list"], ["jobs", "retry", "1"], ["queues"], ["queues", "pause", "q"]]
)
def test_the_operations_commands_on_an_unmigrated_schema_exit_4(
    migrated_url: str, args: list[str]
) -> None:
    result = cli(migrated_url, *args, "--schema", "nowhere")
    assert result.returncode == 4, result.stderr
    assert 'no queue table sqla_jobs_job in schema "nowhere"' in result.stderr
