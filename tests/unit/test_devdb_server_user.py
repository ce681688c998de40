"""devdb creates the embedded wheel's OS user one process at a time (see devdb._os_user)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from devdb import _os_user


def test_concurrent_starts_create_the_user_one_at_a_time() -> None:
    if os.geteuid() != 0:
        pytest.skip("only root makes the wheel create an OS user")
    inside: list[int] = []
    overlaps: list[int] = []
    created: list[str] = []
    start = threading.Barrier(4)

    def create(name: str) -> None:
        inside.append(1)
        if len(inside) > 1:
            overlaps.append(len(inside))
        time.sleep(0.02)  # the useradd the lock must not let another process run beside
        created.append(name)
        inside.pop()

    def one() -> None:
        start.wait()
        _os_user.ready(create)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert created == [_os_user.NAME] * 4
    assert overlaps == []


def test_a_user_other_than_root_creates_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[str] = []
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    _os_user.ready(created.append)
    assert created == []
