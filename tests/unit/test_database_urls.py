"""The application's own database URL, for any driver, as the psycopg 3 URL and the libpq
connection string sqla-jobs connects with: no database, no driver but psycopg installed needed."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import make_url

from sqla_jobs import DatabaseURLError
from sqla_jobs.db.urls import (
    hosts_without_primary,
    libpq_conninfo,
    parse_url,
    redact,
    sqlalchemy_url,
    with_database,
)

#: A password with every character a URL gives a meaning to, and a quote and a space for libpq.
SECRET = "p@ss:w/rd?#%'\\ x+&="
#: ``SECRET`` as it appears in a URL (percent-encoded).
ENCODED = "p%40ss%3Aw%2Frd%3F%23%25%27%5C%20x%2B%26%3D"


def conninfo(url: str) -> dict[str, object]:
    """``url``'s libpq connection string as libpq reads it back."""
    return conninfo_to_dict(libpq_conninfo(url))


@pytest.mark.parametrize(
    "scheme",
    [
        "postgresql",
        "postgres",
        "postgresql+psycopg",
        "postgresql+psycopg_async",
        "postgresql+psycopg2",
        "postgresql+asyncpg",
        "postgresql+pg8000",
    ],
)
def test_every_driver_form_of_a_url_reaches_the_same_server_through_psycopg_3(scheme: str) -> None:
    url = f"{scheme}://app:secret@db.example:5433/shop"
    assert sqlalchemy_url(url) == "postgresql+psycopg://app:secret@db.example:5433/shop"
    assert conninfo(url) == {
        "host": "db.example",
        "port": "5433",
        "user": "app",
        "password": "secret",
        "dbname": "shop",
    }


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+asyncpg", "postgresql+psycopg2"])
def test_a_url_encoded_password_with_special_characters_survives_intact(scheme: str) -> None:
    url = f"{scheme}://app:{ENCODED}@db.example/shop"
    assert conninfo(url)["password"] == SECRET
    assert make_url(sqlalchemy_url(url)).password == SECRET
    assert make_url(with_database(url, "other")).password == SECRET


@pytest.mark.parametrize(
    "mode", ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
)
def test_asyncpgs_ssl_parameter_becomes_libpqs_sslmode(mode: str) -> None:
    url = f"postgresql+asyncpg://app@db.example/shop?ssl={mode}"
    assert conninfo(url)["sslmode"] == mode
    assert parse_url(url).query == {"sslmode": mode}


def test_asyncpgs_own_spelling_of_the_verify_modes_is_taken() -> None:
    assert conninfo("postgresql+asyncpg://app@h/d?ssl=verify_full")["sslmode"] == "verify-full"


def test_asyncpgs_ssl_that_is_no_sslmode_is_refused_with_the_modes_libpq_takes() -> None:
    with pytest.raises(DatabaseURLError, match=r"ssl='true' \(asyncpg\).*verify-full"):
        parse_url("postgresql+asyncpg://app@db.example/shop?ssl=true")


def test_asyncpgs_connect_timeout_becomes_libpqs_rounded_up_to_whole_seconds() -> None:
    assert conninfo("postgresql+asyncpg://app@h/d?timeout=2.5")["connect_timeout"] == "3"
    with pytest.raises(DatabaseURLError, match="timeout='soon'"):
        parse_url("postgresql+asyncpg://app@h/d?timeout=soon")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+asyncpg://app@h/d?prepared_statement_cache_size=0",
        "postgresql+asyncpg://app@h/d?statement_cache_size=0&max_cached_statement_lifetime=0",
        "postgresql+asyncpg://app@h/d?max_cacheable_statement_size=0&command_timeout=30",
        "postgresql+pg8000://app@h/d?timeout=30&tcp_keepalive=false",
    ],
)
def test_a_drivers_client_side_tuning_is_dropped(url: str) -> None:
    assert parse_url(url).query == {}
    assert conninfo(url) == {"host": "h", "user": "app", "dbname": "d"}


def test_pg8000s_unix_socket_becomes_libpqs_socket_directory_and_port() -> None:
    url = "postgresql+pg8000://app@/shop?unix_sock=/run/postgresql/.s.PGSQL.5433"
    assert conninfo(url) == {
        "host": "/run/postgresql",
        "port": "5433",
        "user": "app",
        "dbname": "shop",
    }
    with pytest.raises(DatabaseURLError, match=r"unix_sock=.*\.s\.PGSQL\.<port>"):
        parse_url("postgresql+pg8000://app@/shop?unix_sock=/tmp/my.sock")


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg2", "postgresql+asyncpg"])
def test_libpq_parameters_pass_through_unchanged(scheme: str) -> None:
    url = (
        f"{scheme}://app@h/d?sslmode=verify-full&sslrootcert=/etc/ca.pem"
        "&options=-csearch_path%3Dshop&target_session_attrs=read-write"
    )
    info = conninfo(url)
    assert info["sslmode"] == "verify-full"
    assert info["sslrootcert"] == "/etc/ca.pem"
    assert info["options"] == "-csearch_path=shop"
    assert info["target_session_attrs"] == "read-write"


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (
            "postgresql+asyncpg://app:hunter2@h/d?server_settings=hunter3",
            "'server_settings' of the asyncpg driver",
        ),
        (
            "postgresql+asyncpg://app:hunter2@h/d?direct_tls=hunter3",
            "'direct_tls' of the asyncpg driver",
        ),
        (
            "postgresql+pg8000://app:hunter2@h/d?source_address=hunter3",
            "'source_address' of the pg8000",
        ),
        ("postgresql+psycopg2://app:hunter2@h/d?sslmod=hunter3", "'sslmod'"),
        ("postgresql://app:hunter2@h/d?cursor_factory=hunter3", "'cursor_factory'"),
    ],
)
def test_a_parameter_with_no_libpq_equivalent_is_refused_by_name_never_by_value(
    url: str, named: str
) -> None:
    with pytest.raises(DatabaseURLError) as caught:
        libpq_conninfo(url)
    message = str(caught.value)
    assert named in message
    assert "no libpq equivalent" in message
    assert "hunter2" not in message
    assert "hunter3" not in message


def test_sqlalchemys_multi_host_form_becomes_libpqs_host_and_port_lists() -> None:
    for url in (
        "postgresql+asyncpg://app@/d?host=a:5432&host=b:5433",
        "postgresql+psycopg2://app@/d?host=a,b&port=5432,5433",
    ):
        info = conninfo(url)
        assert (info["host"], info["port"]) == ("a,b", "5432,5433")


def test_a_socket_directory_given_as_host_is_kept() -> None:
    assert conninfo("postgresql+psycopg2://app@/d?host=/var/run/postgresql")["host"] == (
        "/var/run/postgresql"
    )


def test_a_parameter_given_twice_is_refused() -> None:
    with pytest.raises(DatabaseURLError, match="'sslmode' is given more than once"):
        parse_url("postgresql://app@h/d?sslmode=require&sslmode=disable")


def test_two_parameters_saying_the_same_thing_are_refused() -> None:
    with pytest.raises(DatabaseURLError, match="'ssl' and 'sslmode' say the same thing"):
        parse_url("postgresql+asyncpg://app@h/d?ssl=require&sslmode=disable")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("mysql://app:hunter2@h/d", "unsupported database URL scheme 'mysql'"),
        ("postgresql+nodriver://app:hunter2@h/d", "asyncpg, pg8000, psycopg, psycopg2"),
        ("sqlite:///x.db", "unsupported database URL scheme 'sqlite'"),
        ("postgresql://app:hunter2@h:port/d", "cannot parse database URL"),
        ("not a url", "cannot parse database URL"),
        ("", "empty database URL"),
    ],
)
def test_a_url_that_cannot_work_is_one_database_url_error_without_the_password(
    url: str, fragment: str
) -> None:
    with pytest.raises(DatabaseURLError) as caught:
        parse_url(url)
    assert fragment in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_redact_hides_the_password_of_the_netloc_and_of_the_query() -> None:
    shown = redact(f"postgresql+asyncpg://app:{ENCODED}@h/d?password=hunter2&sslpassword=hunter3")
    assert "hunter2" not in shown
    assert "hunter3" not in shown
    assert "p%40ss" not in shown
    assert shown.startswith("postgresql+asyncpg://app:***@h/d?")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app@/d?host=a:5432&host=b:5432",
        "postgresql://app@/d?host=a,b&port=5432,5432",
        "postgresql+asyncpg://app@/d?host=a:5432&host=b:5432&target_session_attrs=any",
        "postgresql://app@/d?host=a:5432&host=b:5432&target_session_attrs=prefer-standby",
    ],
)
def test_several_hosts_without_a_primary_attribute_are_warned_about(url: str) -> None:
    warning = hosts_without_primary(url)
    assert warning is not None
    assert "2 hosts" in warning
    assert "target_session_attrs=read-write" in warning


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app@/d?host=a:5432&host=b:5432&target_session_attrs=read-write",
        "postgresql://app@/d?host=a,b&target_session_attrs=primary",
        "postgresql://app@db:5432/d",
        "postgresql://app@/d?host=/var/run/postgresql",
    ],
)
def test_one_host_or_a_primary_attribute_needs_no_warning(url: str) -> None:
    assert hosts_without_primary(url) is None
