"""The command line on job dependencies: ``jobs list --state waiting`` lists the jobs waiting on
their parents, ``jobs cancel`` of a parent cancels them, and ``jobs show`` lists a job's parents
and children with their states."""

from __future__ import annotations

import json
import uuid

from sqlalchemy import Engine, delete, func, update
from sqlalchemy.orm import Session

from sqla_jobs.model import Job, JobOutcome
from tests.acceptance._processes import run_cli
from tests.acceptance.ops_app import jobs


def _ids(url: str, *args: str) -> list[int]:
    result = run_cli("jobs", "list", "--json", *args, database_url=url)
    assert result.returncode == 0, result.stderr
    return [json.loads(line)["id"] for line in result.stdout.splitlines()]


def test_jobs_list_filters_on_the_waiting_state(clean: Engine, migrated_url: str) -> None:
    with Session(clean) as session:
        parent = jobs.enqueue(session, "note", {"tag": "parent"}, delay=3600)
        child = jobs.enqueue(session, "note", {"tag": "child"}, depends_on=[parent])
        ids = (parent.id, child.id)
        session.commit()
    assert _ids(migrated_url, "--state", "waiting") == [ids[1]]
    assert _ids(migrated_url, "--state", "pending,waiting") == [ids[1], ids[0]]
    cancel = run_cli("jobs", "cancel", str(ids[0]), database_url=migrated_url)
    assert cancel.returncode == 0, cancel.stderr
    assert _ids(migrated_url, "--state", "cancelled") == [ids[1], ids[0]]


def _show(url: str, job_id: int, *args: str) -> str:
    result = run_cli("jobs", "show", str(job_id), *args, database_url=url)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_jobs_show_lists_parents_children_and_what_a_gone_parent_recorded(
    clean: Engine, migrated_url: str
) -> None:
    with Session(clean) as session:
        waits = jobs.enqueue(session, "note", {"tag": "waits"}, delay=3600)
        ends = jobs.enqueue(session, "note", {"tag": "ends"}, delay=3600)
        child = jobs.enqueue(
            session, "note", {"tag": "child"}, depends_on=[waits, ends], on_parent_failure="run"
        )
        ids = (waits.id, ends.id, child.id)
        session.commit()
    with Session(clean) as session:
        # A worker's completion: the running row deleted, its outcome recorded by the trigger.
        claimed = {"state": "running", "lease_token": uuid.uuid4(), "lease_expires_at": func.now()}
        session.execute(update(Job).where(Job.id == ids[1]).values(claimed))
        session.execute(delete(Job).where(Job.id == ids[1]))
        session.commit()
    shown = json.loads(_show(migrated_url, ids[2], "--json"))
    assert shown["state"] == "waiting"
    assert shown["waiting_on"] == 1
    assert [(p["id"], p["state"], p["present"]) for p in shown["parents"]] == [
        (ids[0], "pending", True),
        (ids[1], "completed", False),
    ]
    assert shown["children"] == []
    text = _show(migrated_url, ids[2])
    assert "waiting on     1 parent\n" in text
    assert f"{ids[1]} (row gone): completed, runs anyway" in text
    parent = json.loads(_show(migrated_url, ids[0], "--json"))
    assert parent["waiting_on"] is None
    assert [(c["id"], c["state"], c["kind"]) for c in parent["children"]] == [
        (ids[2], "waiting", "note")
    ]
    with Session(clean) as session:
        # An outcome pruned by retention: the parent is only known to be gone.
        session.execute(delete(JobOutcome).where(JobOutcome.id == ids[1]))
        session.commit()
    shown = json.loads(_show(migrated_url, ids[2], "--json"))
    assert shown["parents"][1] == {
        "id": ids[1],
        "kind": None,
        "state": "gone",
        "present": False,
        "run_anyway": True,
    }


def test_jobs_show_of_a_job_outside_any_graph_has_no_dependency_lines(
    clean: Engine, migrated_url: str
) -> None:
    with Session(clean) as session:
        alone = jobs.enqueue(session, "note", {"tag": "alone"}, delay=3600).id
        session.commit()
    shown = json.loads(_show(migrated_url, alone, "--json"))
    assert (shown["parents"], shown["children"], shown["waiting_on"]) == ([], [], None)
    text = _show(migrated_url, alone)
    for absent in ("waiting on", "parents", "children"):
        assert absent not in text
