"""``completed`` builds an outcome's dict itself (the worker builds one per job): it must equal
what the dataclass's constructor builds."""

from __future__ import annotations

import pytest

from sqla_jobs._outcome import Outcome, completed

from ._claimed import claimed_job


@pytest.mark.parametrize("committed", [False, True])
def test_completed_equals_the_constructed_outcome(committed: bool) -> None:
    job = claimed_job(3)
    outcome = completed(job, committed=committed)
    assert vars(outcome) == vars(Outcome(job, committed=committed))
    assert outcome.error is None
    assert outcome.job is job


def test_each_completed_outcome_is_its_own() -> None:
    first, second = completed(claimed_job(1)), completed(claimed_job(2))
    first.runtime = 1.5
    assert second.runtime == 0.0
