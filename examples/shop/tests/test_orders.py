"""Orders through the HTTP API: the order and its shipping job in one transaction, the job run
inline by ``sqla_jobs.testing``, everything rolled back at the end of each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqla_jobs import testing
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from shop.app import app, get_session
from shop.models import Order, order_jobs
from shop.tasks import ShipOrder, jobs

ORDER = {"customer": "Ada", "item": "teapot", "quantity": 2}


@pytest.fixture
def client(sqla_jobs_sessionmaker: sessionmaker[Session]) -> Iterator[TestClient]:
    """The app, its sessions joined to the test's transaction: one Session per request, as in
    production, each of whose commits only releases a SAVEPOINT."""

    def session_in_test_transaction() -> Iterator[Session]:
        with sqla_jobs_sessionmaker() as session:
            yield session

    app.dependency_overrides[get_session] = session_in_test_transaction
    try:
        with TestClient(app) as client:
            yield client
    finally:
        app.dependency_overrides.pop(get_session)


def test_an_order_placed_over_http_is_shipped_by_its_job(
    client: TestClient, sqla_jobs_session: Session
) -> None:
    placed = client.post("/orders", json=ORDER)
    assert placed.status_code == 201, placed.text
    order = placed.json()
    assert order["status"] == "placed"
    assert [(j["kind"], j["queue"], j["state"]) for j in order["jobs"]] == [
        ("ship_order", "shipping", "pending")
    ]
    testing.assert_enqueued(sqla_jobs_session, ShipOrder, jobs=jobs, order_id=order["id"])

    assert testing.run_jobs(jobs, sqla_jobs_session).done == 1

    shown = client.get(f"/orders/{order['id']}").json()
    assert shown["status"] == "shipped"
    assert shown["shipped_at"] is not None
    # A completed job is deleted, and its link to the order with it.
    assert shown["jobs"] == []
    testing.refute_enqueued(sqla_jobs_session, ShipOrder, jobs=jobs)


def test_what_the_app_commits_stays_in_the_test_transaction(
    client: TestClient, sqla_jobs_engine: Engine, sqla_jobs_session: Session
) -> None:
    order_id = client.post("/orders", json=ORDER).json()["id"]
    assert sqla_jobs_session.get(Order, order_id) is not None
    testing.assert_enqueued(sqla_jobs_session, ShipOrder, jobs=jobs, order_id=order_id)
    # The app committed, but only a SAVEPOINT: no other connection sees the order or its job,
    # and the plugin rolls both back when the test ends.
    with sqla_jobs_engine.connect() as other:
        assert other.scalar(select(func.count()).where(Order.id == order_id)) == 0
        assert other.scalar(select(func.count()).where(order_jobs.c.order_id == order_id)) == 0


def test_a_rejected_order_enqueues_nothing(client: TestClient, sqla_jobs_session: Session) -> None:
    rejected = client.post("/orders", json={**ORDER, "quantity": 0})
    assert rejected.status_code == 422
    testing.refute_enqueued(sqla_jobs_session, ShipOrder, jobs=jobs)


def test_an_unknown_order_is_not_found(client: TestClient) -> None:
    assert client.get("/orders/999999").status_code == 404
