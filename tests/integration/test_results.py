"""Job results (``results=True``) with real in-process workers: a results kind's return value is
stored with its completion, in the same transaction, on every completion path, and read by its
children (``ctx.parent_results``) and by ``jobs.result``; a kind without results stores nothing;
a result that cannot be stored fails the run."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_jobs import JobContext, Jobs, NoResultError, testing
from sqla_jobs.kinds import MAX_RESULT_BYTES
from tests._waiting import DEADLINE, wait_until
from tests.integration._workers import running_workers

from ._workflows import QUIET_POLL, WOKEN_WITHIN, rows, state


class Make(BaseModel):
    n: int
    #: What the handler returns: "json", "model", "none", "set", "big".
    shape: str = "json"


class MakeInSession(Make):
    pass


class MakeSync(Make):
    pass


class Plain(BaseModel):
    n: int


class Child(BaseModel):
    n: int


class Total(BaseModel):
    total: int
    label: str


def _value(args: Make) -> Any:
    if args.shape == "model":
        return Total(total=args.n * 10, label=f"n{args.n}")
    if args.shape == "none":
        return None
    if args.shape == "set":
        return {1, 2}
    if args.shape == "big":
        return "x" * MAX_RESULT_BYTES
    return {"n": args.n, "list": [args.n, "a"]}


class Seen:
    """What each child saw in ``ctx.parent_results``, by the child's ``n``."""

    def __init__(self) -> None:
        self.results: dict[int, dict[int, Any]] = {}
        self.done = threading.Event()

    def record(self, n: int, results: dict[int, Any]) -> None:
        self.results[n] = results
        self.done.set()


def results_jobs() -> tuple[Jobs, Seen]:
    """``res_make`` stores what it returns (max 1 attempt), ``res_plain`` stores nothing,
    ``res_child`` records its ``ctx.parent_results``; ``res_session`` stores a result in its
    AsyncSession's transaction after enqueueing a ``res_plain`` job there."""
    jobs = Jobs()
    seen = Seen()

    @jobs.kind("res_make", Make, results=True, max_attempts=1)
    def make(args: Make, ctx: JobContext) -> Any:
        return _value(args)

    @jobs.kind("res_plain", Plain)
    def plain(args: Plain, ctx: JobContext) -> Any:
        return {"ignored": args.n}

    @jobs.kind("res_child", Child)
    async def child(args: Child, ctx: JobContext) -> None:
        seen.record(args.n, await ctx.aparent_results())

    @jobs.kind("res_session", MakeInSession, results=True, max_attempts=1)
    async def in_session(args: MakeInSession, ctx: JobContext, session: AsyncSession) -> Any:
        await session.run_sync(lambda s: jobs.enqueue(s, Plain(n=args.n + 1000), delay=3600))
        return _value(args)

    @jobs.kind("res_sync_session", MakeSync, results=True, max_attempts=1)
    def in_sync_session(args: MakeSync, ctx: JobContext, session: Session) -> dict[str, Any]:
        jobs.enqueue(session, Plain(n=args.n + 1000), delay=3600)
        return {"n": args.n, "list": [args.n, "a"]} if args.shape == "json" else {"s": {1}}

    return jobs, seen


def _outcome_rows(engine: Engine, ids: list[int]) -> dict[int, tuple[str, Any]]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id, outcome, result FROM sqla_jobs_outcome WHERE id = ANY(:ids)"),
            {"ids": ids},
        )
        return {r[0]: (r[1], r[2]) for r in found}


def _result(engine: Engine, jobs: Jobs, job_id: int) -> Any:
    with Session(engine) as session:
        return jobs.result(session, job_id)


def test_a_childs_ctx_and_jobs_result_read_what_its_parents_returned(
    clean: Engine, migrated_url: str
) -> None:
    jobs, seen = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL):
        with Session(clean, expire_on_commit=False) as session:
            a = jobs.enqueue(session, Make(n=1))
            b = jobs.enqueue(session, Make(n=2, shape="model"))
            c = jobs.enqueue(session, Make(n=3, shape="none"))
            p = jobs.enqueue(session, Plain(n=4))
            jobs.enqueue(session, Child(n=5), depends_on=[a, b, c, p])
            session.commit()
        assert seen.done.wait(WOKEN_WITHIN)
    # A parent of a kind without results has no entry; JSON null is a stored result.
    assert seen.results[5] == {
        a.id: {"n": 1, "list": [1, "a"]},
        b.id: {"total": 20, "label": "n2"},
        c.id: None,
    }
    assert _result(clean, jobs, a.id) == {"n": 1, "list": [1, "a"]}
    assert _result(clean, jobs, c.id) is None
    # The outcome trigger (parents with dependents) and the result's upsert wrote one row.
    assert _outcome_rows(clean, [a.id, p.id]) == {
        a.id: ("completed", {"n": 1, "list": [1, "a"]}),
        p.id: ("completed", None),
    }
    with pytest.raises(NoResultError):
        _result(clean, jobs, p.id)


def test_a_kind_without_results_stores_nothing(clean: Engine, migrated_url: str) -> None:
    jobs, _ = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        with Session(clean, expire_on_commit=False) as session:
            p = jobs.enqueue(session, Plain(n=1))
            session.commit()
        wait_until(lambda: state(clean, p.id) is None, "the job completed")
    assert _outcome_rows(clean, [p.id]) == {}
    with pytest.raises(NoResultError) as caught:
        _result(clean, jobs, p.id)
    assert caught.value.job_id == p.id


def test_a_results_kind_without_dependents_still_stores_its_result(
    clean: Engine, migrated_url: str
) -> None:
    jobs, _ = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        with Session(clean, expire_on_commit=False) as session:
            made = jobs.enqueue_many(session, [Make(n=i) for i in range(20)])
            session.commit()
        wait_until(lambda: not rows(clean, made), "the jobs completed")
    stored = _outcome_rows(clean, list(made))
    assert {i: stored[i][1]["n"] for i in made} == {i: n for n, i in enumerate(made)}


@pytest.mark.parametrize(("shape", "words"), [("set", "as JSON"), ("big", "bytes of JSON")])
def test_a_result_that_cannot_be_stored_fails_the_run_and_cancels_its_child(
    clean: Engine, migrated_url: str, shape: str, words: str
) -> None:
    jobs, seen = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        with Session(clean, expire_on_commit=False) as session:
            bad = jobs.enqueue(session, Make(n=1, shape=shape))
            child = jobs.enqueue(session, Child(n=2), depends_on=[bad])
            session.commit()
        wait_until(lambda: state(clean, child.id) == "cancelled", "the child cancelled")
    found = rows(clean, [bad.id])[bad.id]
    assert found["state"] == "dead"
    assert found["errors"][-1]["error"] == "ResultError"
    assert words in found["last_error"]
    assert "the handler succeeded" in found["last_error"]
    assert _outcome_rows(clean, [bad.id]) == {bad.id: ("dead", None)}
    assert not seen.done.is_set()


def test_the_handler_session_stores_its_result_in_its_transaction(
    clean: Engine, migrated_url: str
) -> None:
    jobs, seen = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL):
        with Session(clean, expire_on_commit=False) as session:
            good = jobs.enqueue(session, "res_session", {"n": 1})
            jobs.enqueue(session, Child(n=2), depends_on=[good])
            session.commit()
        assert seen.done.wait(WOKEN_WITHIN)
    assert seen.results[2] == {good.id: {"n": 1, "list": [1, "a"]}}
    assert _result(clean, jobs, good.id) == {"n": 1, "list": [1, "a"]}


def test_a_session_result_that_cannot_be_stored_rolls_the_handlers_writes_back(
    clean: Engine, migrated_url: str
) -> None:
    jobs, _ = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        with Session(clean, expire_on_commit=False) as session:
            bad = jobs.enqueue(session, "res_session", {"n": 1, "shape": "set"})
            session.commit()
        wait_until(lambda: state(clean, bad.id) == "dead", "the run failed")
    assert rows(clean, [bad.id])[bad.id]["errors"][-1]["error"] == "ResultError"
    assert _outcome_rows(clean, [bad.id]) == {}
    with clean.connect() as conn:
        enqueued = conn.execute(
            text("SELECT count(*) FROM sqla_jobs_job WHERE kind = 'res_plain'")
        ).scalar()
    assert enqueued == 0


def test_the_history_copy_stores_the_result(clean: Engine, migrated_url: str) -> None:
    jobs, seen = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL, keep_history=True):
        with Session(clean, expire_on_commit=False) as session:
            a = jobs.enqueue(session, Make(n=7, shape="model"))
            jobs.enqueue(session, Child(n=8), depends_on=[a])
            session.commit()
        assert seen.done.wait(WOKEN_WITHIN)
    assert seen.results[8] == {a.id: {"total": 70, "label": "n7"}}
    with clean.connect() as conn:
        kept = conn.execute(
            text("SELECT kind FROM sqla_jobs_history WHERE id = :id"), {"id": a.id}
        ).scalar()
    assert kept == "res_make"
    assert _result(clean, jobs, a.id) == {"total": 70, "label": "n7"}


def test_middleware_does_not_lose_the_result(clean: Engine, migrated_url: str) -> None:
    jobs, seen = results_jobs()
    wrapped = threading.Event()

    @jobs.hooks.middleware
    async def around(ctx: JobContext, call_next: Any) -> None:
        wrapped.set()
        await call_next()

    with running_workers(jobs, migrated_url, poll_interval=QUIET_POLL):
        with Session(clean, expire_on_commit=False) as session:
            a = jobs.enqueue(session, Make(n=3))
            jobs.enqueue(session, Child(n=4), depends_on=[a])
            session.commit()
        assert seen.done.wait(WOKEN_WITHIN)
    assert wrapped.wait(DEADLINE)
    assert seen.results[4] == {a.id: {"n": 3, "list": [3, "a"]}}


def test_run_jobs_stores_results_and_gives_them_to_children(clean: Engine) -> None:
    jobs, seen = results_jobs()
    with Session(clean, expire_on_commit=False) as session:
        a = jobs.enqueue(session, Make(n=1, shape="model"))
        assert testing.run_jobs(jobs, session).done == 1
        assert jobs.result(session, a.id) == {"total": 10, "label": "n1"}
        session.commit()
    with Session(clean) as session:
        jobs.enqueue(session, Child(n=2), depends_on=[a])
        session.commit()
    with Session(clean) as session:  # the child was enqueued, and released, by another
        assert testing.run_jobs(jobs, session, all_jobs=True).done == 1
        session.commit()
    assert seen.results[2] == {a.id: {"total": 10, "label": "n1"}}


def test_run_jobs_fails_a_result_that_cannot_be_stored(clean: Engine) -> None:
    jobs, _ = results_jobs()
    with Session(clean, expire_on_commit=False) as session:
        bad = jobs.enqueue(session, Make(n=1, shape="big"))
        result = testing.run_jobs(jobs, session, raise_errors=False)
        assert (result.done, result.dead) == (0, 1)
        with pytest.raises(NoResultError):
            jobs.result(session, bad.id)


def test_a_job_kept_completed_by_a_foreign_key_keeps_its_result(
    clean: Engine, migrated_url: str
) -> None:
    """The application's row points at the job: its DELETE is refused, it is kept
    ``completed``, and its result is stored in that same statement."""
    jobs, seen = results_jobs()
    with clean.begin() as conn:
        conn.execute(text("CREATE TABLE app_result_ref (job_id bigint REFERENCES sqla_jobs_job)"))
    try:
        with Session(clean, expire_on_commit=False) as session:
            a = jobs.enqueue(session, Make(n=5))
            session.execute(text("INSERT INTO app_result_ref VALUES (:id)"), {"id": a.id})
            jobs.enqueue(session, Child(n=6), depends_on=[a])
            session.commit()
        with running_workers(jobs, migrated_url, poll_interval=0.05):
            assert seen.done.wait(DEADLINE)
        assert state(clean, a.id) == "completed"
        assert seen.results[6] == {a.id: {"n": 5, "list": [5, "a"]}}
        assert _result(clean, jobs, a.id) == {"n": 5, "list": [5, "a"]}
    finally:
        with clean.begin() as conn:
            conn.execute(text("DROP TABLE app_result_ref"))


@pytest.mark.parametrize("shape", ["json", "set"])
def test_a_sync_session_handler_stores_its_result_or_rolls_back_with_it(
    clean: Engine, migrated_url: str, shape: str
) -> None:
    jobs, _ = results_jobs()
    with running_workers(jobs, migrated_url, poll_interval=0.05):
        with Session(clean, expire_on_commit=False) as session:
            job = jobs.enqueue(session, "res_sync_session", {"n": 1, "shape": shape})
            session.commit()
        wait_until(lambda: state(clean, job.id) in (None, "dead"), "the run ended")
    with clean.connect() as conn:
        enqueued = conn.execute(
            text("SELECT count(*) FROM sqla_jobs_job WHERE kind = 'res_plain'")
        ).scalar()
    if shape == "json":
        assert _result(clean, jobs, job.id) == {"n": 1, "list": [1, "a"]}
        assert enqueued == 1
    else:
        assert rows(clean, [job.id])[job.id]["errors"][-1]["error"] == "ResultError"
        assert _outcome_rows(clean, [job.id]) == {}
        assert enqueued == 0
