"""The ``due QUEUE SECONDS`` wakeup payload: written and read back, never taken for a queue's name by
a worker of an earlier release, and ignored by a worker in any form it does not understand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pytest

from sqla_jobs.enqueue.payloads import format_due, parse_due
from sqla_jobs.kinds import check_name
from sqla_jobs.worker.listener import Listener

QUEUES = ["default", "mail", "a.b:c-d_9", "x" * 128]


@pytest.mark.parametrize("queue", QUEUES)
@pytest.mark.parametrize("seconds", [0.0, 0.0015, 2.5, 59.999999])
def test_a_due_payload_reads_back_as_written(queue: str, seconds: float) -> None:
    found = parse_due(format_due(queue, seconds))
    assert found is not None
    assert found[0] == queue
    assert found[1] == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize(
    "payload",
    ["default", "due", "due ", "due default", "due  1.0", "due default x", "due default -1",
     "due default nan", "due default inf", "due default 1e400", "Due default 1", "later default 1"],
)  # fmt: skip
def test_any_other_payload_is_not_a_due_one(payload: str) -> None:
    assert parse_due(payload) is None


@pytest.mark.parametrize("queue", QUEUES)
def test_a_due_payload_is_never_a_queue_name(queue: str) -> None:
    # A worker of an earlier release wakes only for a payload equal to one of its queues' names.
    with pytest.raises(ValueError, match="invalid queue name"):
        check_name("queue", format_due(queue, 1.0))


def _listener(on_due: Any) -> tuple[Listener, list[tuple[Any, list[str]]]]:
    calls: list[tuple[Any, list[str]]] = []
    connector = cast(Any, SimpleNamespace(worker="w"))
    listener = Listener(
        connector,
        "jobs",
        ["default", "mail"],
        lambda conn, queues: calls.append((conn, queues)),
        cancel_channel="cancels",
        on_cancel=lambda ids: None,
        on_due=on_due,
    )
    return listener, calls


def _note(listener: Listener, payload: str, channel: str = "jobs") -> None:
    listener._note(psycopg.Notify(channel, payload, 1))


def test_the_listener_sets_the_timer_for_a_due_payload_of_its_queues_only() -> None:
    dues: list[float] = []
    listener, calls = _listener(dues.append)
    _note(listener, format_due("mail", 1.25))
    _note(listener, format_due("elsewhere", 0.5))
    _note(listener, "mail")
    assert dues == [1.25]
    assert listener._notes == ["mail"]
    assert calls == []


@pytest.mark.parametrize("on_due", [None, "set"])
def test_a_payload_the_listener_does_not_understand_is_ignored(on_due: Any) -> None:
    # on_due=None is the released listener's path: its only test was ``payload in queues``.
    dues: list[float] = []
    listener, calls = _listener(dues.append if on_due else None)
    for payload in ["later default 1", "due default soon", "default ", "", format_due("x", 1)]:
        _note(listener, payload)
    if on_due is None:
        _note(listener, format_due("default", 1.0))
    assert listener._notes == []
    assert dues == []
    assert calls == []
