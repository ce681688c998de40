"""A fresh database per measurement, and what the benchmarks read back from the server."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql

from sqla_jobs import migrate
from sqla_jobs.db.urls import libpq_conninfo, with_database

from . import baseline

Subject = Literal["sqla_jobs", "baseline"]

#: The queue table of each subject.
TABLE: dict[Subject, str] = {"sqla_jobs": "sqla_jobs_job", "baseline": "jobs"}
PREFIX = "sqla_jobs_bench"


def connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit psycopg connection to ``url`` (any PostgreSQL URL form)."""
    return psycopg.connect(libpq_conninfo(url), autocommit=True)


@contextlib.contextmanager
def fresh_database(server_url: str, subject: Subject, *, walinspect: bool = False) -> Iterator[str]:
    """Create an empty database on the server, give it ``subject``'s schema, yield its URL; drop
    it (disconnecting whoever is left) on exit."""
    name = f"{PREFIX}_{os.getpid()}_{secrets.token_hex(4)}"
    with connect(server_url) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(server_url, name)
    try:
        if subject == "sqla_jobs":
            migrate.upgrade(url)
        else:
            baseline.create_schema(libpq_conninfo(url))
        if walinspect:
            with connect(url) as conn, contextlib.suppress(psycopg.Error):
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        yield url
    finally:
        with connect(server_url) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@dataclass(frozen=True)
class TableStats:
    """One reading of ``pg_stat_user_tables`` and the sizes of the queue table."""

    n_tup_ins: int
    n_tup_upd: int
    n_tup_hot_upd: int
    n_tup_del: int
    n_live_tup: int
    n_dead_tup: int
    autovacuum_count: int
    vacuum_count: int
    table_bytes: int
    index_bytes: int

    @property
    def row_versions(self) -> int:
        return self.n_tup_ins + self.n_tup_upd + self.n_tup_del


def table_stats(conn: psycopg.Connection[Any], table: str) -> TableStats:
    """Read the cumulative statistics of ``table`` (fresh, not the transaction's cached snapshot)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_live_tup, n_dead_tup, "
        "autovacuum_count, vacuum_count, pg_table_size(relid), pg_indexes_size(relid) "
        "FROM pg_stat_user_tables WHERE relname = %s",
        (table,),
    ).fetchone()
    assert row is not None, f"no statistics for table {table}"
    return TableStats(*(int(v) for v in row))


def settled_stats(
    conn: psycopg.Connection[Any], table: str, *, deletes: int, timeout: float = 15.0
) -> TableStats:
    """Statistics once every backend has reported: backends flush at most once a second and at
    exit, so wait until ``deletes`` deletions are counted and two readings agree."""
    deadline = time.monotonic() + timeout
    last = table_stats(conn, table)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = table_stats(conn, table)
        if now.n_tup_del >= deletes and now == last:
            return now
        last = now
    return last


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    """The server's current WAL insert position."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_bytes(conn: psycopg.Connection[Any], start: str, end: str) -> int:
    """WAL written by the whole server between two positions (includes other databases' traffic)."""
    row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)).fetchone()
    assert row is not None
    return int(row[0])


@dataclass(frozen=True)
class Wal:
    """WAL written for one database: all of it, and the part that is full-page images (which depend
    on when the server last checkpointed, so they differ from run to run)."""

    total: int
    fpi: int

    @property
    def without_fpi(self) -> int:
        return self.total - self.fpi


def wal_of_database(conn: psycopg.Connection[Any], start: str, end: str) -> Wal | None:
    """WAL written for this database only, through ``pg_walinspect``: the records that touch its
    relations, plus every record (commits included) of the transactions that wrote them. None when
    the extension is missing or the WAL was already recycled."""
    try:
        row = conn.execute(
            """
            WITH r AS MATERIALIZED (
                SELECT xid::text AS x, record_length, fpi_length, block_ref
                FROM pg_get_wal_records_info(
                    %(start)s::pg_lsn, least(%(end)s::pg_lsn, pg_current_wal_flush_lsn()))
            ),
            ours AS (
                SELECT DISTINCT x FROM r WHERE x <> '0' AND block_ref LIKE %(pattern)s
            )
            SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM r
            WHERE block_ref LIKE %(pattern)s OR x IN (SELECT x FROM ours)
            """,
            {"start": start, "end": end, "pattern": f"% rel %/{database_oid(conn)}/%"},
        ).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else Wal(int(row[0]), int(row[1]))


def database_oid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def is_empty(conn: psycopg.Connection[Any], table: str) -> bool:
    row = conn.execute(
        sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(table))
    ).fetchone()
    return bool(row and row[0])


def wait_empty(
    conn: psycopg.Connection[Any], table: str, *, timeout: float, every: float = 0.01
) -> float:
    """Poll until ``table`` has no rows; return ``time.perf_counter()`` at the first empty reading.
    Raises ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if is_empty(conn, table):
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{table} still has rows after {timeout:g}s")
        time.sleep(every)


def count_rows(conn: psycopg.Connection[Any], table: str, where: str = "true") -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE {}").format(sql.Identifier(table), sql.SQL(where))
    ).fetchone()
    return int(row[0]) if row else 0


def server_info(server_url: str) -> dict[str, Any]:
    """The server's version and the settings that move the figures."""
    names = (
        "autovacuum",
        "autovacuum_naptime",
        "fsync",
        "synchronous_commit",
        "shared_buffers",
        "max_connections",
        "wal_level",
        "max_wal_size",
    )
    with connect(server_url) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            (list(names),),
        ).fetchall()
    settings = {str(n): str(s) for n, s in rows}
    return {"server_version": version[0] if version else None, "settings": settings}
