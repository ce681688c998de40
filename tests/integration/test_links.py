"""Jobs linked to the application's rows: ``sqla_jobs.link_table``, ``enqueue(link=...)``, finding
and operating on a row's jobs in the application's own ORM, and what a worker does with jobs that
the application's foreign keys point at (a link table's CASCADE, NO ACTION, SET NULL): it never
fails or stops, and its pruner keeps only what it may not delete."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import sys
import threading
import types
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from alembic import command
from pydantic import BaseModel
from sqlalchemy import (
    BigInteger,
    Engine,
    Select,
    create_engine,
    event,
    func,
    inspect,
    literal,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import IntegrityError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateTable

from sqla_jobs import InvalidOptionError, Job, Jobs, Retention, Unique, links
from sqla_jobs.cli.common import CLIError
from sqla_jobs.cli.links import Linked
from sqla_jobs.cli.links import statement as linked_statement
from sqla_jobs.db.urls import libpq_conninfo, sqlalchemy_url
from sqla_jobs.enqueue.insert import CHUNK, COPY_THRESHOLD
from tests._waiting import wait_until
from tests.conftest import REPO, alembic_config

from ._links_app import (
    QUEUE,
    Base,
    Boom,
    Flaky,
    Invoice,
    Note,
    Order,
    Receipt,
    Ticket,
    Voucher,
    app_tables,
    jobs,
    order_jobs,
)
from ._workers import running_workers

ZERO = timedelta(0)


@pytest.fixture
def app(clean: Engine) -> Iterator[Engine]:
    """The engine, with the application's tables (orders, their link table, invoices, receipts)
    created empty, and dropped afterwards."""
    with app_tables(clean):
        yield clean


def new_order(session: Session) -> Order:
    order = Order()
    session.add(order)
    session.flush()
    return order


def linked_ids(engine: Engine, order_id: int) -> list[int]:
    with engine.connect() as conn:
        return sorted(
            conn.scalars(select(order_jobs.c.job_id).where(order_jobs.c.order_id == order_id))
        )


def states(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT id, state FROM sqla_jobs_job")).all())  # type: ignore[arg-type]


# -- the link table ------------------------------------------------------------------------------


def test_link_table_has_a_cascading_foreign_key_each_way_and_an_index_on_job_id(
    app: Engine,
) -> None:
    table = inspect(app)
    fks = {
        fk["referred_table"]: (fk["constrained_columns"], fk["options"].get("ondelete"))
        for fk in table.get_foreign_keys("links_order_jobs")
    }
    assert fks == {
        "links_order": (["order_id"], "CASCADE"),
        "sqla_jobs_job": (["job_id"], "CASCADE"),
    }
    pk = table.get_pk_constraint("links_order_jobs")
    # The application's naming convention names it; the row's key comes first.
    assert (pk["constrained_columns"], pk["name"]) == (
        ["order_id", "job_id"],
        "pk_links_order_jobs",
    )
    indexes = {i["name"]: i["column_names"] for i in table.get_indexes("links_order_jobs")}
    assert indexes == {"ix_links_order_jobs_job_id": ["job_id"]}
    columns = {c["name"]: str(c["type"]) for c in table.get_columns("links_order_jobs")}
    assert columns == {"order_id": "INTEGER", "job_id": "BIGINT"}


def test_link_table_names_the_key_column_after_its_target_by_default() -> None:
    from sqlalchemy import MetaData

    table = links.link_table("x_jobs", MetaData(), Order.id)
    assert [c.name for c in table.primary_key.columns] == ["links_order_id", "job_id"]
    assert links.link_of(table) == links.Link(table, "links_order_id", "job_id")


# -- linking at enqueue ----------------------------------------------------------------------------


def test_enqueue_links_the_job_in_the_callers_transaction_and_a_rollback_discards_both(
    app: Engine,
) -> None:
    with Session(app) as session:
        order = new_order(session)
        job = jobs.enqueue(session, Note(order_id=order.id), link={order_jobs: order.id})
        order_id, job_id = order.id, job.id
        session.commit()
    assert linked_ids(app, order_id) == [job_id]

    with Session(app) as session:
        jobs.enqueue(session, Note(order_id=order_id), link={order_jobs: order_id})
        session.rollback()
    assert linked_ids(app, order_id) == [job_id]
    assert list(states(app)) == [job_id]


@pytest.mark.parametrize("count", [3, COPY_THRESHOLD, CHUNK + 1])
def test_enqueue_many_links_every_job_to_one_row_or_each_to_its_own(
    app: Engine, count: int
) -> None:
    with Session(app) as session:
        shared, *own = (new_order(session) for _ in range(3))
        payloads = [Note(order_id=shared.id) for _ in range(count)]
        all_ids = jobs.enqueue_many(session, payloads, link={order_jobs: shared.id})
        per = [{order_jobs: own[i % 2].id} if i % 3 else None for i in range(count)]
        each_ids = jobs.enqueue_many(session, payloads, link=per)
        shared_id, own_ids = shared.id, [o.id for o in own]
        session.commit()
    assert linked_ids(app, shared_id) == sorted(all_ids)
    for n, order_id in enumerate(own_ids):
        wanted = [i for k, i in enumerate(each_ids) if k % 3 and k % 2 == n]
        assert linked_ids(app, order_id) == sorted(wanted)


def test_the_async_enqueues_link_as_the_sync_ones_do(app: Engine, migrated_url: str) -> None:
    with Session(app) as session:
        order_id = new_order(session).id
        session.commit()

    async def main() -> list[int]:
        engine = create_async_engine(sqlalchemy_url(migrated_url), poolclass=NullPool)
        try:
            async with AsyncSession(engine) as session, session.begin():
                job = await jobs.enqueue_async(
                    session, Note(order_id=order_id), link={order_jobs: order_id}
                )
                ids = await jobs.enqueue_many_async(
                    session, [Note(order_id=order_id)] * 2, link=[{order_jobs: order_id}, None]
                )
                return [job.id, ids[0]]
        finally:
            await engine.dispose()

    linked = asyncio.run(main())
    assert linked_ids(app, order_id) == sorted(linked)


@pytest.mark.parametrize(
    ("link", "message"),
    [
        ({order_jobs: None}, "is None; flush the session first"),
        ({order_jobs: "42"}, "links_order_jobs.order_id takes int, got str '42'"),
        ({order_jobs: True}, "takes int, got bool"),
        ({Order: 1}, "links_order is not a link table"),
        ({"links_order_jobs": 1}, "'links_order_jobs' is not a table"),
        ([order_jobs], "must be a mapping of link tables to keys"),
    ],
)
def test_a_bad_link_is_refused_before_any_sql_and_the_transaction_stays_usable(
    app: Engine, link: Any, message: str
) -> None:
    statements_run: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements_run.append(statement)

    with Session(app) as session:
        order_id = new_order(session).id
        event.listen(app, "before_cursor_execute", record)
        try:
            with pytest.raises(InvalidOptionError, match=re.escape(message)):
                jobs.enqueue(session, Note(order_id=order_id), link=link)
            with pytest.raises(InvalidOptionError, match=re.escape(message)):
                jobs.enqueue_many(session, [Note(order_id=order_id)], link=[link])
        finally:
            event.remove(app, "before_cursor_execute", record)
        assert statements_run == []
        with pytest.raises(InvalidOptionError, match="link has 1 entries for 2 payloads"):
            jobs.enqueue_many(session, [Note(order_id=order_id)] * 2, link=[None])
        job_id = jobs.enqueue(session, Note(order_id=order_id), link={order_jobs: order_id}).id
        session.commit()
    assert linked_ids(app, order_id) == [job_id]


def test_a_link_to_a_row_that_does_not_exist_is_a_foreign_key_violation(app: Engine) -> None:
    with Session(app) as session, pytest.raises(IntegrityError, match="links_order"):
        jobs.enqueue(session, Note(order_id=0), link={order_jobs: 10**9})


UNIQUE = Jobs()


class Refresh(BaseModel):
    order_id: int


UNIQUE.register("links_refresh", Refresh, queue=QUEUE, unique=Unique(by=("order_id",)))


def test_a_unique_duplicate_links_the_job_that_holds_its_key(app: Engine) -> None:
    with Session(app) as session:
        first, second = new_order(session), new_order(session)
        held = UNIQUE.enqueue(session, Refresh(order_id=1), link={order_jobs: first.id})
        again = UNIQUE.enqueue(session, Refresh(order_id=1), link={order_jobs: second.id})
        ids = UNIQUE.enqueue_many(
            session, [Refresh(order_id=1), Refresh(order_id=2)], link={order_jobs: first.id}
        )
        assert again.inserted is False
        assert again.id == held.id
        assert ids.duplicates == [0]
        first_id, second_id, held_id = first.id, second.id, held.id
        session.commit()
    assert linked_ids(app, first_id) == sorted({held_id, ids[1]})
    assert linked_ids(app, second_id) == [held_id]


def test_linking_a_job_a_worker_completes_meanwhile_skips_it_and_keeps_the_transaction(
    app: Engine, migrated_url: str
) -> None:
    """A duplicate's holder may complete between the link statement's snapshot and the foreign
    key's check: that job is not linked, and the caller's transaction goes on."""
    with Session(app) as session:
        order_id = new_order(session).id
        gone, kept = (jobs.enqueue(session, Note(order_id=order_id)).id for _ in range(2))
        session.commit()
    link = links.link_of(order_jobs)
    deleter = psycopg.connect(libpq_conninfo(migrated_url))
    errors: list[BaseException] = []
    try:
        # A worker's completion, under way: the row is deleted but not yet committed.
        deleter.execute("DELETE FROM sqla_jobs_job WHERE id = %s", (gone,))
        with Session(app) as session:
            session.execute(text("SELECT 1"))
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar()

            def link_both() -> None:
                try:
                    per_job = [[(link, order_id)], [(link, order_id)]]
                    links.insert(session, per_job, [gone, kept], None, fresh=False)
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=link_both)
            thread.start()
            wait_until(
                lambda: _waiting_on_a_lock(app, pid), "the foreign key's check waits for the delete"
            )
            deleter.commit()
            thread.join(10)
            assert errors == []
            session.commit()
    finally:
        deleter.close()
    assert linked_ids(app, order_id) == [kept]


def _waiting_on_a_lock(engine: Engine, pid: Any) -> bool:
    with engine.connect() as conn:
        wait = conn.execute(
            text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar()
    return wait == "Lock"


# -- finding a row's jobs in the application's own ORM -----------------------------------------------


def test_job_is_an_ordinary_mapped_class_in_the_applications_session_queries_and_joins(
    app: Engine,
) -> None:
    with Session(app) as session:
        first, second = new_order(session), new_order(session)
        mine = [
            jobs.enqueue(session, Note(order_id=first.id), link={order_jobs: first.id}).id,
            jobs.enqueue(session, Boom(order_id=first.id), link={order_jobs: first.id}).id,
        ]
        theirs = jobs.enqueue(session, Note(order_id=second.id), link={order_jobs: second.id}).id
        jobs.enqueue(session, Note(order_id=0))  # linked to nothing
        first_id, second_id = first.id, second.id
        session.commit()

    with Session(app) as session:
        # The relationship, lazy and eager.
        order = session.get(Order, first_id)
        assert order is not None
        assert [j.id for j in order.jobs] == mine
        assert session.get(Job, mine[0]) is order.jobs[0]  # one identity map
        loaded = session.scalars(select(Order).options(selectinload(Order.jobs))).all()
        assert {o.id: [j.id for j in o.jobs] for o in loaded} == {
            first_id: mine,
            second_id: [theirs],
        }
        # Joins inferred from the foreign keys, with filters on both sides.
        pending = session.scalars(
            select(Job)
            .join(order_jobs)
            .where(order_jobs.c.order_id == first_id, Job.kind == "links_boom")
        ).all()
        assert [j.id for j in pending] == [mine[1]]
        rows = session.execute(
            select(Order.customer, Job.kind, func.count())
            .join(order_jobs, order_jobs.c.order_id == Order.id)
            .join(Job)
            .group_by(Order.customer, Job.kind)
            .order_by(Job.kind)
        ).all()
        assert [tuple(r) for r in rows] == [("acme", "links_boom", 1), ("acme", "links_note", 2)]
        # From a job back to its rows.
        owners = session.scalars(
            select(Order.id).join(order_jobs).join(Job).where(Job.id == theirs)
        ).all()
        assert owners == [second_id]


def test_deleting_an_order_drops_its_links_and_leaves_its_jobs(app: Engine) -> None:
    with Session(app) as session:
        order = new_order(session)
        ids = jobs.enqueue_many(session, [Note(order_id=order.id)] * 2, link={order_jobs: order.id})
        order_id = order.id
        session.commit()
    with Session(app) as session:
        session.delete(session.get(Order, order_id))
        session.commit()
    assert linked_ids(app, order_id) == []
    assert states(app) == dict.fromkeys(ids, "pending")


def test_cancel_and_retry_take_a_select_of_job_ids_as_a_filter(app: Engine) -> None:
    with Session(app) as session:
        order, other = new_order(session), new_order(session)
        pending, running, dead = (
            jobs.enqueue(session, Note(order_id=order.id), link={order_jobs: order.id}).id
            for _ in range(3)
        )
        elsewhere = jobs.enqueue(session, Note(order_id=0), link={order_jobs: other.id}).id
        order_id = order.id
        session.commit()
    with app.begin() as conn:
        conn.execute(
            text(
                "UPDATE sqla_jobs_job SET state = 'running', attempts = 1, locked_by = 'w', "
                "lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute' "
                "WHERE id = :id"
            ),
            {"id": running},
        )
        conn.execute(
            text("UPDATE sqla_jobs_job SET state = 'dead', finished_at = now() WHERE id = :id"),
            {"id": dead},
        )

    of_order: Select[Any] = select(order_jobs.c.job_id).where(order_jobs.c.order_id == order_id)
    with Session(app) as session, session.begin():
        result = jobs.cancel(session, of_order)
    assert (result.cancelled, result.requested) == ([pending], [running])
    assert states(app)[dead] == "dead"
    assert states(app)[elsewhere] == "pending"

    with Session(app) as session, session.begin():
        assert jobs.retry(session, of_order) == [dead]
        # Ids no job has are no error for a filter; any query of ids will do.
        nowhere = select(literal(10**12, BigInteger)).union_all(select(literal(10**13, BigInteger)))
        assert jobs.cancel(session, nowhere).cancelled == []
    assert states(app)[dead] == "pending"


# -- repr ---------------------------------------------------------------------------------------------


def test_a_jobs_repr_shows_what_an_operator_needs_and_never_its_payload(app: Engine) -> None:
    at = datetime(2026, 12, 1, 7, 6, 23, 391277, tzinfo=timezone.utc)
    built = Job(
        id=42,
        kind="send_invoice",
        state="pending",
        queue="mail",
        attempts=0,
        max_attempts=10,
        run_at=at,
        payload={"card": "4111 1111 1111 1111"},
    )
    assert repr(built) == (
        "<Job 42 send_invoice pending queue=mail attempt 0/10 run_at=2026-12-01T07:06:23+00:00>"
    )
    assert repr(Job()) == "<Job ? ? ? queue=? attempt ?/? run_at=?>"

    with Session(app) as session:
        job = jobs.enqueue(session, Note(order_id=7))
        session.commit()
        assert re.fullmatch(
            rf"<Job {job.id} links_note pending queue=links attempt 0/10 run_at=\S+\+00:00>",
            repr(job),
        ), repr(job)
        # Expired, then detached: the repr runs no SQL and raises nothing.
        session.expire(job)
        session.expunge(job)
    assert repr(job) == "<Job ? ? ? queue=? attempt ?/? run_at=?>"


# -- a worker and the application's foreign keys ---------------------------------------------------

#: How the application's row points at a job: through a link table (CASCADE), or a foreign key
#: of its own with NO ACTION, RESTRICT, NO ACTION deferred to the commit, or SET NULL.
STYLES = {
    "link_table": None,
    "no_action": Invoice,
    "restrict": Voucher,
    "deferred": Ticket,
    "set_null": Receipt,
}
#: The styles whose foreign key refuses the deletion of a job it points at.
REFUSING = ("no_action", "restrict", "deferred")


def enqueue_linked(
    session: Session, style: str, order: Order, payload: BaseModel, **options: Any
) -> Job:
    """Enqueue ``payload`` and point the application's row at its job the way ``style`` does."""
    if style == "link_table":
        return jobs.enqueue(session, payload, link={order_jobs: order.id}, **options)
    job = jobs.enqueue(session, payload, **options)
    session.add(STYLES[style](job_id=job.id))  # type: ignore[misc]
    session.flush()
    return job


@pytest.mark.parametrize("keep_history", [False, True], ids=["delete", "history"])
@pytest.mark.parametrize("style", STYLES)
def test_a_worker_completes_fails_cancels_and_prunes_linked_jobs_and_never_stops(
    app: Engine,
    migrated_url: str,
    caplog: pytest.LogCaptureFixture,
    style: str,
    keep_history: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="sqla_jobs.worker")
    with Session(app) as session:
        order = new_order(session)
        done = enqueue_linked(session, style, order, Note(order_id=order.id))
        dead = enqueue_linked(session, style, order, Boom(order_id=order.id))
        retried = enqueue_linked(session, style, order, Flaky(order_id=order.id))
        later = enqueue_linked(
            session, style, order, Note(order_id=order.id), delay=timedelta(hours=1)
        )
        plain = jobs.enqueue(session, Note(order_id=0)).id
        ids = {"done": done.id, "dead": dead.id, "cancelled": later.id, "retried": retried.id}
        order_id = order.id
        session.commit()
    with Session(app) as session, session.begin():
        assert jobs.cancel(session, [ids["cancelled"]]).cancelled == [ids["cancelled"]]

    zero = Retention(completed=ZERO, dead=ZERO, cancelled=ZERO)
    with running_workers(
        jobs,
        migrated_url,
        queues=[QUEUE],
        keep_history=keep_history,
        retention=zero,
        prune_interval=0.05,
        poll_interval=0.05,
    ) as (worker,):
        assert worker.pruner is not None
        if style in REFUSING:
            # Kept: the completed jobs (their rows could not be deleted), the dead and the
            # cancelled one (the pruner may not delete them); the unreferenced job is gone.
            kept = {
                ids["done"]: "completed",
                ids["retried"]: "completed",
                ids["dead"]: "dead",
                ids["cancelled"]: "cancelled",
            }
            wait_until(lambda: states(app) == kept, f"{kept} kept, the rest gone")
            runs = worker.pruner.runs
            wait_until(
                lambda: worker.pruner is not None and worker.pruner.runs >= runs + 2, "2 runs"
            )
            assert states(app) == kept
            events = {getattr(r, "event", None) for r in caplog.records}
            assert {"kept_completed", "prune_kept"} <= events
            # Once the application lets go, the next run prunes them.
            with app.begin() as conn:
                for table in ("links_invoice", "links_voucher", "links_ticket"):
                    conn.execute(text(f"DELETE FROM {table}"))
        wait_until(lambda: states(app) == {}, "every job finished and pruned")
        # Still working: a job enqueued now runs.
        with Session(app) as session:
            last = jobs.enqueue(session, Note(order_id=order_id)).id
            session.commit()
        wait_until(lambda: last not in states(app), "a job enqueued afterwards ran")
        # Counted when its completion's round trip returns, a moment after the row is gone.
        wait_until(lambda: worker.counts["done"] == 4, "done, retried, plain and last counted")
        assert (worker.counts["failed"], worker.counts["dead"]) == (1, 1)
    assert plain not in states(app)

    with app.connect() as conn:
        links_left = conn.execute(text("SELECT count(*) FROM links_order_jobs")).scalar()
        receipts = conn.execute(text("SELECT job_id FROM links_receipt")).scalars().all()
        orders = conn.execute(text("SELECT id FROM links_order")).scalars().all()
    assert links_left == 0
    assert orders == [order_id]
    if style == "set_null":
        assert receipts == [None] * 4


# -- another schema -------------------------------------------------------------------------------

ALT_SCHEMA = "sqla_jobs_links_alt"
APP_SCHEMA = "links_app"


@pytest.fixture
def alt_app(clean: Engine, migrated_url: str) -> Iterator[Engine]:
    """The migrations in schema ``sqla_jobs_links_alt``, and an engine whose connections have
    the application's schema then that one on their search_path, as docs/sqlalchemy.md says to set
    it: the application's tables are created in the first, and their foreign keys reach the job
    table in the second."""
    drop = f'DROP SCHEMA IF EXISTS "{ALT_SCHEMA}", "{APP_SCHEMA}" CASCADE'
    with clean.begin() as conn:
        conn.execute(text(drop))
        conn.execute(text(f'CREATE SCHEMA "{ALT_SCHEMA}"'))
        conn.execute(text(f'CREATE SCHEMA "{APP_SCHEMA}"'))
    cfg = alembic_config(migrated_url)
    cfg.attributes["sqla_jobs_schema"] = ALT_SCHEMA
    command.upgrade(cfg, "head")
    engine = create_engine(
        sqlalchemy_url(migrated_url),
        connect_args={"options": f"-csearch_path={APP_SCHEMA},{ALT_SCHEMA}"},
        poolclass=NullPool,
    )
    try:
        Base.metadata.create_all(engine)
        yield engine
    finally:
        engine.dispose()
        with clean.begin() as conn:
            conn.execute(text(drop))


def test_a_schema_jobs_links_to_its_own_job_table_and_the_cli_lists_a_rows_jobs(
    alt_app: Engine, clean: Engine
) -> None:
    alt = Jobs(schema=ALT_SCHEMA)
    alt.register("links_note", Note, queue=QUEUE)
    with Session(alt_app) as session:
        order = new_order(session)
        job_id = alt.enqueue(session, Note(order_id=order.id), link={order_jobs: order.id}).id
        alt.enqueue(session, Note(order_id=order.id))
        order_id = order.id
        assert [j.id for j in order.jobs] == [job_id]
        session.commit()
    params = {"states": None, "queue": None, "kind": None, "meta": None, "limit": 10}
    options = {"schema_translate_map": {None: ALT_SCHEMA}}
    for named in ("links_order_jobs", f"{APP_SCHEMA}.links_order_jobs"):
        linked = Linked.parse(f"{named}.order_id={order_id}")
        with Session(alt_app) as session:
            stmt = linked_statement(session, ALT_SCHEMA, linked)
            rows = session.execute(
                stmt, {**params, "linked": linked.value}, execution_options=options
            )
            assert [r.id for r in rows] == [job_id]
    # Its foreign key points at that schema's job table: for the default one, not a link table.
    linked = Linked.parse(f"{APP_SCHEMA}.links_order_jobs.order_id={order_id}")
    with Session(clean) as session, pytest.raises(CLIError, match="is not a link table"):
        linked_statement(session, None, linked)


# -- privileges: the lines of docs/roles.md ----------------------------------------------------------

LINK_GRANTS = "-- link tables"


def roles_doc_block() -> str:
    doc = (REPO / "docs" / "roles.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", doc, flags=re.DOTALL)
    (block,) = [b for b in blocks if b.startswith(LINK_GRANTS)]
    return block


def test_the_link_table_grants_of_docs_roles_md_are_enough_and_the_worker_needs_none(
    clean: Engine,
) -> None:
    """As docs/roles.md says: the application's owner needs REFERENCES on the job's id to create a
    link table, the enqueuer INSERT on it, the reader SELECT; the worker needs nothing on it, its
    completion's cascade running as the link table's owner."""
    suffix = secrets.token_hex(3)
    roles = ("app_owner", "enqueuer", "worker", "operator", "reader")
    role = {r: f"links_{r}_{suffix}" for r in roles}
    block = roles_doc_block()
    for r, name in role.items():
        block = re.sub(rf"\b(jobs_)?{r}\b", name, block)
    block = block.replace("jobs.sqla_jobs_job", "sqla_jobs_job")
    block = re.sub(r"\border_jobs\b", "links_order_jobs", block)
    as_jobs_owner, *as_app_owner = (
        s.strip() for s in re.sub(r"--[^\n]*", "", block).split(";") if s.strip()
    )
    create = [
        "CREATE TABLE links_order (id serial PRIMARY KEY, customer text)",
        str(CreateTable(order_jobs).compile(dialect=postgresql.dialect())),  # type: ignore[no-untyped-call]
    ]

    def as_role(conn: Any, who: str, sql: str, **params: Any) -> Any:
        conn.execute(text(f'SET LOCAL ROLE "{role[who]}"'))
        return conn.execute(text(sql), params)

    with clean.begin() as conn:
        for name in role.values():
            conn.execute(text(f'CREATE ROLE "{name}"'))
        conn.execute(text(f'GRANT USAGE, CREATE ON SCHEMA public TO "{role["app_owner"]}"'))
        others = ", ".join(f'"{role[r]}"' for r in roles[1:])
        conn.execute(text(f"GRANT USAGE ON SCHEMA public TO {others}"))
        # The grants of docs/roles.md's first block that these steps use.
        conn.execute(text(f'GRANT INSERT, SELECT ON sqla_jobs_job TO "{role["enqueuer"]}"'))
        conn.execute(text(f'GRANT SELECT, UPDATE, DELETE ON sqla_jobs_job TO "{role["worker"]}"'))
        conn.execute(text(f'GRANT SELECT ON sqla_jobs_job TO "{role["reader"]}"'))
    try:
        with clean.connect() as conn:
            as_role(conn, "app_owner", create[0])
            with pytest.raises(ProgrammingError, match="permission denied for table sqla_jobs_job"):
                as_role(conn, "app_owner", create[1])
        with clean.begin() as conn:
            conn.execute(text(as_jobs_owner))
            for sql in create:
                as_role(conn, "app_owner", sql)
            as_role(conn, "app_owner", "INSERT INTO links_order DEFAULT VALUES")
            for grant in as_app_owner:
                conn.execute(text(grant))
        with Session(clean) as session:
            session.execute(text(f'SET LOCAL ROLE "{role["enqueuer"]}"'))
            job_id = jobs.enqueue(session, Note(order_id=1), link={order_jobs: 1}).id
            session.commit()
        with clean.begin() as conn:
            sql = "SELECT count(*) FROM links_order_jobs WHERE order_id = 1 AND job_id = :id"
            assert as_role(conn, "reader", sql, id=job_id).scalar() == 1
        with clean.begin() as conn:
            # A worker's completion: no privilege on the link table, and the cascade goes through.
            as_role(conn, "worker", "DELETE FROM sqla_jobs_job WHERE id = :id", id=job_id)
        with clean.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM links_order_jobs")).scalar() == 0
    finally:
        with clean.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS links_order_jobs, links_order"))
            for name in role.values():
                conn.execute(text(f'DROP OWNED BY "{name}"'))
                conn.execute(text(f'DROP ROLE "{name}"'))


# -- the guide: docs/sqlalchemy.md ---------------------------------------------------------------------

GUIDE = REPO / "docs" / "sqlalchemy.md"
SECTION = "## Jobs linked to your rows"


def guide_blocks() -> list[str]:
    """The Python blocks of the guide's section, as printed."""
    page = GUIDE.read_text()
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def guide_module(name: str, source: str) -> dict[str, Any]:
    """Run ``source`` as the body of a module called ``name`` (the ORM resolves a mapped class's
    annotations in its module); its namespace."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, "docs/sqlalchemy.md", "exec"), module.__dict__)
    namespace: dict[str, Any] = module.__dict__
    return namespace


def test_the_guide_section_runs_as_written(
    clean: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """The section's code, run as it is printed: the declarations, then the use, on order 42."""
    declarations, use = guide_blocks()
    names = guide_module("guide_links", declarations)
    Base_, Order_ = names["Base"], names["Order"]

    class SendInvoice(BaseModel):
        invoice_id: int

    guide_jobs = Jobs()
    guide_jobs.register("send_invoice", SendInvoice, queue="mail")
    Base_.metadata.create_all(clean)
    try:
        with Session(clean) as session:
            session.add_all([Order_(id=42), Order_(id=43)])
            other = guide_jobs.enqueue(session, SendInvoice(invoice_id=1)).id
            session.commit()
        names.update(
            engine=clean,
            jobs=guide_jobs,
            SendInvoice=SendInvoice,
            payloads=[SendInvoice(invoice_id=i) for i in (8, 9)],
        )
        exec(compile(use, "docs/sqlalchemy.md", "exec"), names)
        printed = capsys.readouterr().out.splitlines()
        assert len(printed) == 3
        assert all(
            re.fullmatch(r"<Job \d+ send_invoice pending queue=mail attempt 0/10 run_at=\S+>", p)
            for p in printed
        )
        assert len(names["pending"]) == 3
        linked = sorted(j.id for j in names["pending"])
        assert states(clean) == {**dict.fromkeys(linked, "cancelled"), other: "pending"}
    finally:
        Base_.metadata.drop_all(clean)


def test_the_guide_declarations_are_what_link_table_builds() -> None:
    declarations, _ = guide_blocks()
    names = guide_module("guide_links_declarations", declarations)
    table = names["order_jobs"]
    assert links.link_of(table) == links.Link(table, "order_id", "job_id")
    assert str(table.c.order_id.foreign_keys.pop().column) == "orders.id"


def test_a_job_with_parents_is_linked_like_any_other_and_a_rollback_discards_both(
    app: Engine,
) -> None:
    """``link=`` and ``depends_on=`` together: the waiting child is linked to the row, and a
    rollback discards the job, its link and its edges. The parent is a ``Job`` from a Session
    that committed since (expired): it still names its job."""
    with Session(app) as session:
        order = new_order(session)
        parent = jobs.enqueue(session, Note(order_id=order.id), delay=3600)
        child = jobs.enqueue(
            session, Note(order_id=order.id), link={order_jobs: order.id}, depends_on=[parent]
        )
        order_id, child_id = order.id, child.id
        session.commit()
    assert linked_ids(app, order_id) == [child_id]
    assert states(app)[child_id] == "waiting"

    with Session(app) as session:
        jobs.enqueue(
            session, Note(order_id=order_id), link={order_jobs: order_id}, depends_on=[parent]
        )
        session.rollback()
    assert linked_ids(app, order_id) == [child_id]
    with app.connect() as conn:
        edges = conn.execute(text("SELECT child_id FROM sqla_jobs_dependency")).scalars().all()
    assert edges == [child_id]
