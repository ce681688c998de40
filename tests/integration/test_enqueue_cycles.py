"""An enqueue leaves no reference cycle behind: the caller's Session (its transaction, connection
and identity map) is freed by reference counting the moment the caller drops it, as a Session
that only inserted its own rows is. A cycle would leave every enqueuing transaction's objects to
the cyclic garbage collector, which in a process enqueueing hundreds of jobs a second then runs
several times a second, each full collection walking the whole application's heap."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from datetime import timedelta

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from sqla_jobs import Jobs, Unique


class Ping(BaseModel):
    n: int = 0


class Once(BaseModel):
    key: str


def _jobs(wakeup: str = "after_commit") -> Jobs:
    jobs = Jobs(wakeup=wakeup)  # type: ignore[arg-type]
    jobs.kind("ping", Ping)(lambda args, ctx: None)
    jobs.kind("once", Once, unique=Unique(by=("key",)))(lambda args, ctx: None)
    return jobs


Enqueue = Callable[[Jobs, Session], object]

WAYS: dict[str, tuple[str, Enqueue]] = {
    "one": ("after_commit", lambda jobs, s: jobs.enqueue(s, Ping(n=1))),
    "one, in_transaction": ("in_transaction", lambda jobs, s: jobs.enqueue(s, Ping(n=1))),
    "one, no wakeup": ("none", lambda jobs, s: jobs.enqueue(s, Ping(n=1))),
    "delayed": ("after_commit", lambda jobs, s: jobs.enqueue(s, Ping(), delay=timedelta(hours=1))),
    "many": ("after_commit", lambda jobs, s: jobs.enqueue_many(s, [Ping(n=i) for i in range(3)])),
    "unique": ("after_commit", lambda jobs, s: jobs.enqueue(s, Once(key="k"))),
    "in a savepoint": ("after_commit", lambda jobs, s: _in_savepoint(jobs, s)),
}


def _in_savepoint(jobs: Jobs, session: Session) -> None:
    with session.begin_nested():
        jobs.enqueue(session, Ping(n=2))


@pytest.mark.parametrize("way", list(WAYS))
def test_the_enqueuing_session_is_freed_without_the_garbage_collector(
    clean: Engine, collector_off: None, way: str
) -> None:
    wakeup, enqueue = WAYS[way]
    jobs = _jobs(wakeup)
    with Session(clean) as warm, warm.begin():  # first-use caches (compiled SQL, the notifier)
        enqueue(jobs, warm)
    del warm
    session = Session(clean)
    with session.begin():
        enqueue(jobs, session)
    session.close()
    gone = weakref.ref(session)
    del session
    assert gone() is None, "the Session is kept alive by a reference cycle: " + ", ".join(
        sorted({type(r).__qualname__ for r in gc.get_referrers(gone())})
    )
