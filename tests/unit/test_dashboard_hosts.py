"""The dashboard's guards without a database: the allow-list of Host names, the origin check of
POSTs against it, and the throttle of failed sign-ins (its clock injected, nothing sleeps)."""

from __future__ import annotations

import base64
import logging

import pytest
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send

from sqla_jobs import ConfigurationError
from sqla_jobs.cli.dashboard import allowed_hosts
from sqla_jobs.dashboard._hosts import AllowedHosts, foreign_origin, host_entries, host_entry
from sqla_jobs.dashboard._security import BasicAuth
from sqla_jobs.dashboard._throttle import Throttle, client_key

LOCAL = frozenset({"127.0.0.1:8000", "localhost:8000", "[::1]:8000", "jobs.example.com"})


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    await PlainTextResponse("hello")(scope, receive, send)


@pytest.mark.parametrize(
    ("value", "entry"),
    [
        ("LocalHost:8000", "localhost:8000"),
        ("[::1]:8000", "[::1]:8000"),
        ("jobs.example.com", "jobs.example.com"),
        ("10.0.0.7:80", "10.0.0.7:80"),
    ],
)
def test_an_allowed_host_is_a_name_or_address_with_an_optional_port(value: str, entry: str) -> None:
    assert host_entry(value) == entry


@pytest.mark.parametrize(
    "value",
    [
        "::1",
        "::1:8000",
        "localhost.",
        "localhost.:8000",
        "a b",
        "host:0",
        "host:70000",
        "[x]:1",
        "",
    ],
)
def test_an_allowed_host_that_cannot_be_compared_exactly_is_refused(value: str) -> None:
    with pytest.raises(ConfigurationError, match="allowed host"):
        host_entry(value)


def test_an_empty_allow_list_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        host_entries([])


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example:8000",
        "localhost",  # the port is part of the name
        "localhost:8001",
        "localhost.:8000",  # a trailing dot is another name to a browser
        "[::1]",
        "[0:0:0:0:0:0:0:1]:8000",
        "127.0.0.1:8000.attacker.example",
        "jobs.example.com:8000",
        "",
    ],
)
def test_a_request_for_another_host_gets_400_before_the_app_runs(host: str) -> None:
    client = TestClient(AllowedHosts(hello, allowed=LOCAL))
    answered = client.get("/", headers={"Host": host})
    assert answered.status_code == 400
    assert answered.text == "Unknown host: this dashboard does not answer to that name.\n"


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "LOCALHOST:8000", "[::1]:8000"])
def test_a_request_for_an_allowed_host_reaches_the_app(host: str) -> None:
    client = TestClient(AllowedHosts(hello, allowed=LOCAL))
    assert client.get("/", headers={"Host": host}).text == "hello"


@pytest.mark.parametrize(
    ("origin", "scheme"),
    [
        ("http://localhost:8000", "http"),
        ("http://[::1]:8000", "http"),
        ("https://jobs.example.com", "http"),  # a TLS proxy in front ended the encryption
        ("https://jobs.example.com", "https"),
        ("http://127.0.0.1:8000/jobs?state=dead", "http"),  # a Referer
    ],
)
def test_an_origin_among_the_allowed_hosts_passes(origin: str, scheme: str) -> None:
    assert foreign_origin(origin, scheme, LOCAL) is None


@pytest.mark.parametrize(
    ("origin", "scheme", "shown"),
    [
        ("http://attacker.example:8000", "http", "http://attacker.example:8000"),
        ("http://localhost:8001", "http", "http://localhost:8001"),
        ("http://localhost", "http", "http://localhost"),
        ("http://jobs.example.com", "https", "http://jobs.example.com"),
        ("ftp://localhost:8000", "http", "ftp://localhost:8000"),
        ("http://a@localhost:8000", "http", "http://a@localhost:8000"),
        ("null", "http", "null"),
    ],
)
def test_an_origin_outside_the_allowed_hosts_is_foreign(
    origin: str, scheme: str, shown: str
) -> None:
    assert foreign_origin(origin, scheme, LOCAL) == shown


def test_the_cli_allows_the_loopback_names_with_the_port_and_the_names_given() -> None:
    assert allowed_hosts("127.0.0.1", 8123, ["jobs.example.com", " "]) == [
        "127.0.0.1:8123",
        "localhost:8123",
        "[::1]:8123",
        "jobs.example.com",
    ]
    assert "[2001:db8::5]:9000" in allowed_hosts("2001:db8::5", 9000, [])
    assert "dash.example:9000" in allowed_hosts("dash.example", 9000, [])
    assert "localhost" in allowed_hosts("127.0.0.1", 80, []), "port 80: browsers omit it"


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("testclient", "testclient"),
        (None, "-"),
    ],
)
def test_failures_are_counted_per_address_and_per_ipv6_64(address: str | None, key: str) -> None:
    assert client_key(address) == key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_fifth_failure_in_a_minute_blocks_the_address_until_the_minute_ends() -> None:
    clock = Clock()
    throttle = Throttle(clock=clock)
    assert [throttle.failed("a") for _ in range(5)] == [False] * 4 + [True]
    assert throttle.retry_after("a") == 60
    assert throttle.retry_after("b") is None, "another address is not blocked"
    clock.now += 59.5
    assert throttle.retry_after("a") == 1
    clock.now += 0.5
    assert throttle.retry_after("a") is None
    assert not throttle.failed("a"), "a new window starts"


def test_failures_spread_over_more_than_a_minute_do_not_block() -> None:
    clock = Clock()
    throttle = Throttle(clock=clock)
    for _ in range(12):
        throttle.failed("a")
        clock.now += 20
    assert throttle.retry_after("a") is None


def test_the_table_keeps_at_most_its_capacity_and_evicts_the_oldest() -> None:
    throttle = Throttle(capacity=3, limit=1, clock=Clock())
    for key in ("a", "b", "c", "d"):
        throttle.failed(key)
    assert len(throttle) == 3
    assert throttle.retry_after("a") is None
    assert throttle.retry_after("d") == 60


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_failed_sign_ins_are_logged_without_secrets_and_throttled_with_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    app = BasicAuth(hello, user="ops", password="right-pass", throttle=Throttle(clock=clock))
    client = TestClient(app)
    caplog.set_level(logging.INFO, "sqla_jobs.dashboard")
    for _ in range(3):
        assert client.get("/").status_code == 401, "the first challenge is no failure"
    assert not caplog.records
    for _ in range(4):
        assert client.get("/", headers=basic("ops", "guess-1")).status_code == 401
    assert client.get("/", headers=basic("Secret-Typed-As-User", "x")).status_code == 401
    blocked = client.get("/", headers=basic("ops", "right-pass"))
    assert blocked.status_code == 429, "once blocked, even the right password waits"
    assert blocked.headers["retry-after"] == "60"
    logged = caplog.text
    assert logged.count("failed sign-in from testclient") == 5
    assert "wrong password" in logged
    assert "unknown user name" in logged
    assert "refusing sign-ins from testclient for 60 s" in logged
    for secret in ("guess-1", "right-pass", "Secret-Typed-As-User"):
        assert secret not in logged
    clock.now += 60
    assert client.get("/", headers=basic("ops", "right-pass")).text == "hello"
