"""Unique keys without a database: what a key is made of, and the declarations that cannot work."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from sqla_jobs import EnqueuedIds, Unique
from sqla_jobs.unique import MAX_KEY_CHARS, key_of


class Order(BaseModel):
    order_id: int
    note: str = ""


def test_the_key_is_the_kind_and_the_chosen_fields_as_canonical_json() -> None:
    unique = Unique(by=("order_id",)).check(Order)
    a = key_of("refresh", unique, '{"order_id":1,"note":"x"}', "default", None)
    b = key_of("refresh", unique, '{"note":"y","order_id":1}', "default", None)
    assert a == b
    assert a.key == 'refresh:{"order_id":1}'
    assert a.states == ("pending", "running", "waiting")
    assert a.period is None


def test_the_whole_payload_and_the_kind_alone() -> None:
    whole = key_of("k", Unique().check(Order), '{"order_id":1,"note":"é"}', "q", None)
    assert whole.key == 'k:{"note":"é","order_id":1}'
    alone = key_of("k", Unique(by=()).check(Order), '{"order_id":1}', "q", None)
    assert alone.key == "k:{}"


def test_by_queue_and_an_explicit_key() -> None:
    unique = Unique(by=(), by_queue=True).check(Order)
    assert key_of("k", unique, "{}", "mail", None).key == "k:{}|queue=mail"
    assert key_of("k", unique, "{}", "mail", "import-1").key == "k:import-1|queue=mail"


def test_a_long_key_is_stored_as_its_sha256() -> None:
    key = key_of("k", Unique().check(Order), "{}", "q", "x" * MAX_KEY_CHARS).key
    assert key.startswith("k:sha256:")
    assert len(key) == len("k:sha256:") + 64


def test_states_always_hold_pending_running_and_waiting_in_a_fixed_order() -> None:
    assert Unique(states=("dead",)).check(Order).states == (
        "pending",
        "running",
        "dead",
        "waiting",
    )
    assert Unique(states=("cancelled", "pending")).check(Order).states == (
        "pending",
        "running",
        "cancelled",
        "waiting",
    )


@pytest.mark.parametrize(
    ("unique", "message"),
    [
        (Unique(by=("nope",)), "not fields of Order"),
        (Unique(states=("finished",)), "unknown state"),
        (Unique(states="dead"), "sequence of state names"),  # type: ignore[arg-type]
        (Unique(period=timedelta(0)), "1 s or more"),
        (Unique(period=timedelta(seconds=1.5)), "whole seconds"),
    ],
)
def test_declarations_that_cannot_work_are_refused(unique: Unique, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unique.check(Order)


def test_a_single_field_name_is_taken_as_one_field() -> None:
    assert Unique(by="order_id").check(Order).by == ("order_id",)  # type: ignore[arg-type]


def test_enqueued_ids_is_a_list_with_flags() -> None:
    ids = EnqueuedIds([5, 6, 5], [True, True, False])
    assert ids == [5, 6, 5]
    assert ids.duplicates == [2]
    assert ids.replaced == [False, False, False]
    plain = EnqueuedIds([1, 2])
    assert plain.inserted == [True, True]
    assert plain.duplicates == []
