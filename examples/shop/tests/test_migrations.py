"""The shop's Alembic environment on an empty database: both branches, the shop's and sqla-jobs',
up and down, as docs/migrations.md of sqla-jobs says."""

from __future__ import annotations

from collections.abc import Callable

import sqla_jobs
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from shop.db import database_url

# The package's own tables, from its metadata: they come with its branch, whatever its release.
SQLA_JOBS_TABLES = set(sqla_jobs.metadata.tables)
SHOP_TABLES = {"orders", "order_jobs"}


def tables(url: str) -> set[str]:
    engine = create_engine(database_url(url), poolclass=NullPool)
    with engine.connect() as conn:
        found = set(
            conn.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
        )
    engine.dispose()
    return found


def test_upgrade_heads_creates_both_branches_and_check_finds_nothing_to_do(
    alembic: Callable[..., str], empty_database_url: str
) -> None:
    alembic(empty_database_url, "upgrade", "heads")
    assert tables(empty_database_url) == SHOP_TABLES | SQLA_JOBS_TABLES | {"alembic_version"}
    # sqla-jobs' tables are in target_metadata: autogenerate knows them and proposes no drop.
    assert "No new upgrade operations detected" in alembic(empty_database_url, "check")


def test_downgrading_the_shop_leaves_sqla_jobs_tables_alone(
    alembic: Callable[..., str], empty_database_url: str
) -> None:
    alembic(empty_database_url, "upgrade", "heads")
    alembic(empty_database_url, "downgrade", "shop@base")
    assert tables(empty_database_url) == SQLA_JOBS_TABLES | {"alembic_version"}
    heads = alembic(empty_database_url, "heads").splitlines()
    (sqla_jobs_head,) = (line.split()[0] for line in heads if "(sqla_jobs)" in line)
    assert alembic(empty_database_url, "current").split() == [sqla_jobs_head, "(head)"]

    alembic(empty_database_url, "upgrade", "heads")
    assert tables(empty_database_url) >= SHOP_TABLES
