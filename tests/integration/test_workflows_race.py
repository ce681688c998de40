"""Job dependencies under concurrency, with two or three connections: a child enqueued while its
parent completes is released exactly once whichever commits first; a parent's completion never
waits on the child's open transaction (only on its commit); concurrent completers of one child's
parents release it once; crossed batches do not deadlock."""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests._waiting import DEADLINE, wait_until

from ._workflows import (
    Step,
    claim_by_hand,
    complete_held,
    enqueue,
    outcome,
    rows,
    workflow_jobs,
)


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def main() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return thread, errors


def _waiting_on_a_lock(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            ).scalar()
        )


def _released_once(engine: Engine, child: int) -> None:
    found = rows(engine, [child])[child]
    assert (found["state"], found["waiting_on"]) == ("pending", 0)


def test_a_parent_completed_while_the_childs_transaction_is_open_releases_it_at_commit(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    with clean.begin() as conn:
        token = claim_by_hand(conn, parent)
    with Session(clean, expire_on_commit=False) as session:
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent])
        assert child.state == "waiting"
        # The whole completion runs and commits while the child's transaction is open: it waits
        # on nothing of it (lock_timeout turns a wait into an error).
        with clean.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '5s'"))
            assert complete_held(conn, parent, token) == [parent]
        session.commit()
    _released_once(clean, child.id)
    assert outcome(clean, parent) is None  # nobody depended on it when it ended


def test_a_child_committing_while_its_parents_completion_is_open_waits_for_it_then_is_released(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    with clean.begin() as conn:
        token = claim_by_hand(conn, parent)
    with clean.connect() as completer, Session(clean, expire_on_commit=False) as session:
        completer.begin()
        assert complete_held(completer, parent, token) == [parent]
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent])  # sees it running
        assert child.state == "waiting"
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        thread, errors = _in_thread(session.commit)
        wait_until(lambda: _waiting_on_a_lock(clean, pid), "the child's commit waits")
        completer.commit()
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert not errors
    _released_once(clean, child.id)


def test_a_child_committed_before_its_parent_completes_is_released_by_the_completion(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    with clean.begin() as conn:
        token = claim_by_hand(conn, parent)
    child = enqueue(clean, jobs, 2, depends_on=[parent])
    assert rows(clean, [parent])[parent]["has_dependents"] is True
    with clean.begin() as conn:
        complete_held(conn, parent, token)
    _released_once(clean, child)
    assert outcome(clean, parent) == "completed"


def test_a_parent_dead_while_the_childs_transaction_is_open_cancels_it_at_commit(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    parent = enqueue(clean, jobs, 1)
    with Session(clean, expire_on_commit=False) as session:
        child = jobs.enqueue(session, Step(n=2), depends_on=[parent])
        with clean.begin() as conn:
            conn.execute(
                text("UPDATE sqla_jobs_job SET state = 'dead', finished_at = now() WHERE id = :i"),
                {"i": parent},
            )
        session.commit()
    found = rows(clean, [child.id])[child.id]
    assert found["state"] == "cancelled"
    assert found["last_error"] == f"parent job {parent} ended dead"


def test_concurrent_completers_of_one_childs_parents_release_it_once(clean: Engine) -> None:
    jobs, _ = workflow_jobs()
    parents = [enqueue(clean, jobs, n) for n in range(1, 5)]
    child = enqueue(clean, jobs, 9, depends_on=parents)
    with clean.begin() as conn:
        tokens = [claim_by_hand(conn, p) for p in parents]
    # Two completers, two parents each, their deletes done, their commits at once.
    barrier = threading.Barrier(2)

    def complete(pairs: list[tuple[int, uuid.UUID]]) -> None:
        with clean.connect() as conn:
            conn.begin()
            for p, t in pairs:
                complete_held(conn, p, t)
            barrier.wait(DEADLINE)
            conn.commit()

    pairs = list(zip(parents, tokens, strict=True))
    threads = [_in_thread(functools.partial(complete, half)) for half in (pairs[:2], pairs[2:])]
    for thread, errors in threads:
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert not errors, errors
    _released_once(clean, child)


def test_batches_ending_parents_of_two_children_in_crossed_order_do_not_deadlock(
    clean: Engine,
) -> None:
    jobs, _ = workflow_jobs()
    p1, p2, p3, p4 = (enqueue(clean, jobs, n) for n in range(1, 5))
    x = enqueue(clean, jobs, 10, depends_on=[p1, p4])
    y = enqueue(clean, jobs, 11, depends_on=[p2, p3])
    with clean.begin() as conn:
        tokens = {p: claim_by_hand(conn, p) for p in (p1, p2, p3, p4)}
    barrier = threading.Barrier(2)

    def complete(order: list[int]) -> None:
        with clean.connect() as conn:
            conn.begin()
            for p in order:  # one statement per claim, as a batch of several claims sends
                complete_held(conn, p, tokens[p])
            barrier.wait(DEADLINE)
            conn.commit()

    # One batch ends a parent of x then one of y; the other, one of y then one of x.
    threads = [_in_thread(functools.partial(complete, o)) for o in ([p1, p3], [p2, p4])]
    for thread, errors in threads:
        thread.join(DEADLINE)
        assert not thread.is_alive()
        assert not errors, errors
    _released_once(clean, x)
    _released_once(clean, y)
