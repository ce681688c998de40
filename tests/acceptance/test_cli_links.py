"""``sqla-jobs jobs list --linked TABLE.COLUMN=VALUE`` as an operator runs it: one row's jobs,
with the other filters; and a table that is not a link table, a column it lacks, a value of the
wrong type or a name that is not an identifier refused with exit 2, reading nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.acceptance._processes import run_cli
from tests.acceptance.test_cli import assert_one_line_error
from tests.integration._links_app import Boom, Note, Order, app_tables, jobs, order_jobs


@pytest.fixture
def app(clean: Engine) -> Iterator[Engine]:
    with app_tables(clean):
        yield clean


def listed(url: str, *args: str) -> list[int]:
    result = run_cli("jobs", "list", "--json", *args, database_url=url)
    assert result.returncode == 0, result.stderr
    return [json.loads(line)["id"] for line in result.stdout.splitlines()]


def test_jobs_list_linked_shows_one_rows_jobs_newest_first_with_the_other_filters(
    app: Engine, migrated_url: str
) -> None:
    with Session(app) as session:
        mine, theirs = Order(), Order()
        session.add_all([mine, theirs])
        session.flush()
        a = jobs.enqueue(session, Note(order_id=mine.id), link={order_jobs: mine.id}).id
        b = jobs.enqueue(session, Boom(order_id=mine.id), link={order_jobs: mine.id}).id
        c = jobs.enqueue(session, Note(order_id=0), link={order_jobs: theirs.id}).id
        jobs.enqueue(session, Note(order_id=0))  # linked to nothing
        order, other = mine.id, theirs.id
        session.commit()
    with app.begin() as conn:
        conn.execute(
            text("UPDATE sqla_jobs_job SET state = 'dead', finished_at = now() WHERE id = :id"),
            {"id": b},
        )

    linked = f"links_order_jobs.order_id={order}"
    table = run_cli("jobs", "list", "--linked", linked, database_url=migrated_url)
    assert table.returncode == 0, table.stderr
    assert [int(line.split()[0]) for line in table.stdout.splitlines()[1:]] == [b, a]
    assert listed(migrated_url, "--linked", linked) == [b, a]
    assert listed(migrated_url, "--linked", f"public.{linked}") == [b, a]
    assert listed(migrated_url, "--linked", linked, "--state", "pending") == [a]
    assert listed(migrated_url, "--linked", linked, "--kind", "links_boom") == [b]
    assert listed(migrated_url, "--linked", f"links_order_jobs.order_id={other}") == [c]
    assert listed(migrated_url, "--linked", "links_order_jobs.order_id=999999") == []


@pytest.mark.parametrize(
    ("linked", "fragment"),
    [
        ("nosuch.order_id=1", "no table nosuch"),
        ("links_order.id=1", "links_order is not a link table: none of its foreign keys"),
        ("links_order_jobs.nope=1", "has no key column 'nope'"),
        ("links_order_jobs.job_id=1", "has no key column 'job_id'"),
        ("links_order_jobs.order_id=abc", "'abc' is not a value of order_id"),
        ("links_order_jobs.order_id=99999999999", "is not a value of order_id"),
        ('"links_order_jobs".order_id=1', "is not a plain identifier"),
        ("links_order_jobs;DROP TABLE links_order.order_id=1", "is not a plain identifier"),
        ("links_order_jobs.order_id", "use [SCHEMA.]TABLE.COLUMN=VALUE"),
        ("order_id=1", "use [SCHEMA.]TABLE.COLUMN=VALUE"),
        ("a.b.c.d=1", "use [SCHEMA.]TABLE.COLUMN=VALUE"),
    ],
    ids=[
        "no-table",
        "not-a-link-table",
        "no-column",
        "the-job-column",
        "not-a-number",
        "out-of-range",
        "quoted",
        "injection",
        "no-value",
        "no-table-named",
        "too-many-parts",
    ],
)
def test_jobs_list_linked_refuses_a_bad_filter_with_exit_2_and_reads_nothing(
    app: Engine, migrated_url: str, linked: str, fragment: str
) -> None:
    result = run_cli("jobs", "list", "--linked", linked, database_url=migrated_url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert_one_line_error(result.stderr, fragment)
    with app.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM links_order")).scalar() == 0
