"""What a link table is, and what ``link=`` and ``--linked`` accept, checked without a database."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import BigInteger, Column, ForeignKey, Integer, MetaData, Table, Text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.schema import CreateTable

from sqla_jobs import ConfigurationError, InvalidOptionError, Job, link_table, links
from sqla_jobs.cli.common import CLIError
from sqla_jobs.cli.links import Linked

META = MetaData()
ORDERS = Table("orders", META, Column("id", Integer, primary_key=True))
TICKETS = Table("tickets", META, Column("id", UUID(as_uuid=True), primary_key=True))
ORDER_JOBS = link_table("order_jobs", META, ORDERS.c.id, column="order_id")
TICKET_JOBS = link_table("ticket_jobs", META, TICKETS.c.id)


def test_link_table_builds_both_cascading_foreign_keys_a_two_column_key_and_a_job_index() -> None:
    from sqlalchemy.dialects import postgresql

    ddl = str(CreateTable(ORDER_JOBS).compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
    assert "order_id INTEGER NOT NULL" in ddl
    assert "job_id BIGINT NOT NULL" in ddl
    assert "PRIMARY KEY (order_id, job_id)" in ddl
    assert "FOREIGN KEY(order_id) REFERENCES orders (id) ON DELETE CASCADE" in ddl
    assert "FOREIGN KEY(job_id) REFERENCES sqla_jobs_job (id) ON DELETE CASCADE" in ddl
    assert [list(i.columns.keys()) for i in ORDER_JOBS.indexes] == [["job_id"]]
    # Its own MetaData, not the package's.
    assert ORDER_JOBS.metadata is META
    assert TICKET_JOBS.c.keys() == ["tickets_id", "job_id"]


def test_link_table_refuses_a_target_that_is_not_a_column() -> None:
    with pytest.raises(ConfigurationError, match="must be a table's column"):
        link_table("x", MetaData(), "orders.id")


def test_a_hand_written_table_with_a_key_and_a_foreign_key_to_the_job_is_a_link_table() -> None:
    meta = MetaData()
    table = Table(
        "mine",
        meta,
        Column("customer", Text, primary_key=True),
        Column("the_job", BigInteger, ForeignKey(Job.id), primary_key=True),
        Column("note", Text),
    )
    assert links.link_of(table) == links.Link(table, "customer", "the_job")


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ([Column("order_id", Integer, primary_key=True)], "has 0"),
        (
            [
                Column("a", BigInteger, ForeignKey(Job.id), primary_key=True),
                Column("b", BigInteger, ForeignKey(Job.id), primary_key=True),
            ],
            "has 2",
        ),
        (
            [
                Column("id", Integer, primary_key=True),
                Column("order_id", Integer),
                Column("job_id", BigInteger, ForeignKey(Job.id)),
            ],
            "its primary key must be two columns",
        ),
    ],
    ids=["no-job-key", "two-job-keys", "surrogate-key"],
)
def test_a_table_that_is_not_a_link_table_is_refused_naming_what_it_lacks(
    columns: list[Column[object]], message: str
) -> None:
    table = Table("not_links", MetaData(), *columns)
    with pytest.raises(InvalidOptionError, match=f"not_links is not a link table.*{message}"):
        links.link_of(table)


def test_link_values_are_checked_against_their_columns_python_type() -> None:
    ticket = uuid.uuid4()
    assert links.check({ORDER_JOBS: 42, TICKET_JOBS: ticket}) == [
        (links.link_of(ORDER_JOBS), 42),
        (links.link_of(TICKET_JOBS), ticket),
    ]
    with pytest.raises(InvalidOptionError, match=r"ticket_jobs\.tickets_id takes UUID, got str"):
        links.check({TICKET_JOBS: str(ticket)})
    assert links.check(None) == []


def test_enqueue_manys_link_is_one_mapping_for_all_or_one_per_payload() -> None:
    one = links.check({ORDER_JOBS: 1})
    assert links.check_many({ORDER_JOBS: 1}, 3) == [one, one, one]
    assert links.check_many([{ORDER_JOBS: 1}, None], 2) == [one, []]
    assert links.check_many(None, 2) is None
    with pytest.raises(InvalidOptionError, match="link of payload 1: the key for"):
        links.check_many([{ORDER_JOBS: 1}, {ORDER_JOBS: None}], 2)
    with pytest.raises(InvalidOptionError, match="link must be a mapping"):
        links.check_many("order_jobs", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ("order_jobs.order_id=42", (None, "order_jobs", "order_id", "42")),
        ("app.order_jobs.order_id=a=b", ("app", "order_jobs", "order_id", "a=b")),
        ("Order_Jobs.$x=1", None),
        ("_t.c_1=x y", (None, "_t", "c_1", "x y")),
    ],
)
def test_linked_parses_schema_table_column_and_value(
    given: str, parsed: tuple[str | None, str, str, str] | None
) -> None:
    if parsed is None:
        with pytest.raises(CLIError, match="is not a plain identifier"):
            Linked.parse(given)
        return
    linked = Linked.parse(given)
    assert (linked.schema, linked.table, linked.column, linked.value) == parsed


def test_linked_quotes_the_table_name_it_binds() -> None:
    assert Linked.parse("Orders.id=1").table_name == '"Orders"'
    assert Linked.parse("app.order_jobs.id=1").table_name == "app.order_jobs"
    assert Linked.parse("user.t.id=1").table_name == '"user".t'
