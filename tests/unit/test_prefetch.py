"""The automatic prefetch: pure sizing from the handlers' average run time."""

from __future__ import annotations

import pytest

from sqla_jobs.worker.prefetch import Prefetch


@pytest.mark.parametrize(
    ("avg_runtime", "prefetch"),
    [(1e-6, 2048), (0.0001, 2048), (0.0005, 800), (0.01, 40), (0.05, 8), (0.051, 0), (3.0, 0)],
)
def test_the_automatic_prefetch_holds_about_a_tenth_of_a_second_of_work(
    avg_runtime: float, prefetch: int
) -> None:
    auto = Prefetch(concurrency=4)
    assert (auto.size, auto.limit) == (0, 4)  # nothing measured yet: no prefetch
    auto.resize(avg_runtime)
    assert auto.size == prefetch
    # A claim asks for the free slots and at most 1,024 more: two claims fit in a big prefetch.
    assert auto.limit == 4 + min(prefetch, 1024)
    fixed = Prefetch(concurrency=4, fixed=7)
    fixed.resize(avg_runtime)
    assert (fixed.size, fixed.limit) == (7, 11)


def test_the_prefetch_follows_a_moving_average_of_run_times() -> None:
    prefetch = Prefetch(concurrency=2)
    for _ in range(3):
        prefetch.observe(0.01)
    assert abs(prefetch.size - 20) <= 1  # 2 slots x 0.1 s / 10 ms, give or take rounding
    for _ in range(64):
        prefetch.observe(1.0)  # handlers turned slow: prefetched jobs would only wait
    assert prefetch.size == 0
    assert prefetch.avg_runtime is not None
    assert prefetch.avg_runtime > 0.9


def test_a_batch_size_fixes_the_claim_limit() -> None:
    prefetch = Prefetch(concurrency=4, batch_size=3)
    prefetch.resize(1e-6)
    assert (prefetch.size, prefetch.limit) == (2048, 3)
