"""``depends_on`` checked without a database: the parents' ids, the option, and the children's
first state from their parents' states."""

from __future__ import annotations

import pytest

from sqla_jobs import DependencyError, InvalidOptionError
from sqla_jobs.enqueue.depends import Depends, Start, check, start_of
from sqla_jobs.model import Job


def test_parents_are_sorted_once_each_from_jobs_and_ids() -> None:
    job = Job()
    job.__dict__["id"] = 7
    assert check([9, job, 3, 9], "cancel") == Depends((3, 7, 9), run_anyway=False)
    assert check((i for i in [2]), "run") == Depends((2,), run_anyway=True)


def test_no_parents_is_no_dependency() -> None:
    assert check(None, "cancel") is None
    assert check([], "run") is None


@pytest.mark.parametrize(
    ("depends_on", "message"),
    [
        (5, "single int"),
        ("12", "single str"),
        ([0], "positive int"),
        ([True], "flush them first"),
        ([Job()], "flush them first"),
        (["3"], "positive int"),
    ],
)
def test_bad_parents_are_refused(depends_on: object, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        check(depends_on, "cancel")  # type: ignore[arg-type]


def test_an_unknown_option_is_refused_even_without_parents() -> None:
    with pytest.raises(InvalidOptionError, match="on_parent_failure"):
        check(None, "ignore")


def test_unfinished_parents_make_the_child_wait_and_count() -> None:
    rows = [
        (1, "pending", None),
        (2, "running", None),
        (3, "waiting", None),
        (4, None, "completed"),
    ]
    assert start_of(rows, run_anyway=False) == Start("waiting", 3)


def test_finished_parents_leave_the_child_pending() -> None:
    rows = [(1, "completed", None), (2, None, "completed")]
    assert start_of(rows, run_anyway=False) == Start("pending", 0)


@pytest.mark.parametrize(
    ("row", "outcome"),
    [
        ((5, "dead", None), "dead"),
        ((5, "cancelled", None), "cancelled"),
        ((5, None, "deleted"), "deleted"),
    ],
)
def test_a_failed_parent_cancels_the_child_unless_it_runs_anyway(
    row: tuple[int, str | None, str | None], outcome: str
) -> None:
    rows = [(1, "pending", None), row]
    assert start_of(rows, run_anyway=False) == Start("cancelled", 0, 5, outcome)
    assert start_of(rows, run_anyway=True) == Start("waiting", 1)


def test_a_parent_nobody_can_account_for_raises_with_its_id() -> None:
    with pytest.raises(DependencyError, match="8") as raised:
        start_of([(1, "pending", None), (8, None, None)], run_anyway=True)
    assert raised.value.job_ids == [8]
