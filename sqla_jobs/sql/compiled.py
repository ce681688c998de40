"""The worker's statements, compiled once from the builders of :mod:`sqla_jobs.sql` for psycopg.

The worker runs on raw psycopg connections (a dedicated LISTEN connection and a couple of working
ones) rather than an engine: each statement is compiled once here, in the configured schema, and
executed by psycopg, which prepares it server-side after a few runs. The SQL text is still the one
the Core builders produce, and that ``tests/sql/*.sql`` pins down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.sql import ClauseElement

from sqla_jobs.sql import catalog as catalog_sql
from sqla_jobs.sql import claim as claim_sql
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import leases as leases_sql
from sqla_jobs.sql import limiters as limiters_sql
from sqla_jobs.sql import outcomes as outcomes_sql
from sqla_jobs.sql import rate_limits as rate_limits_sql
from sqla_jobs.sql import results as results_sql
from sqla_jobs.sql import scans as scans_sql
from sqla_jobs.sql import tables as tables_sql

__all__ = ["Compiled", "WorkerSQL", "compile_statement"]

_DIALECT = psycopg_dialect.dialect()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Compiled:
    """A statement's SQL text (``%(name)s`` placeholders) and its constant parameters."""

    sql: str
    defaults: dict[str, Any]

    def params(self, **values: Any) -> dict[str, Any]:
        """The full parameter dict: the constants the compiler pulled out, plus ``values``."""
        return {**self.defaults, **values}


def compile_statement(stmt: ClauseElement, schema: str | None) -> Compiled:
    """Compile ``stmt`` for psycopg, with the queue table in ``schema``."""
    kwargs: dict[str, Any] = {}
    if schema is not None:
        kwargs = {"schema_translate_map": {None: schema}, "render_schema_translate": True}
    compiled = stmt.compile(dialect=_DIALECT, **kwargs)
    defaults = {k: v for k, v in compiled.params.items() if v is not None}
    return Compiled(sql=str(compiled), defaults=defaults)


class WorkerSQL:
    """Every statement a worker runs, compiled for one schema; ``meta``: the claims return each
    job's meta too (for a middleware that reads ``ctx.meta``); ``timed``: and when each job
    became due, last (for the metrics' pickup delay)."""

    def __init__(self, schema: str | None, meta: bool = False, timed: bool = False) -> None:
        #: Whether the claims return each job's meta (a 15th column, after ClaimedJob's).
        self.meta = meta
        #: Whether the claims return each job's due_at (the last column).
        self.timed = timed
        self.claim = compile_statement(
            claim_sql.claim_jobs(keyed=False, meta=meta, due_at=timed), schema
        )
        self.complete = compile_statement(outcomes_sql.complete(), schema)
        self.complete_into_history = compile_statement(outcomes_sql.complete_into_history(), schema)
        self.complete_with_results = compile_statement(results_sql.complete_with_results(), schema)
        self.complete_into_history_with_results = compile_statement(
            results_sql.complete_into_history_with_results(), schema
        )
        self.parent_results = compile_statement(results_sql.parent_results(), schema)
        self.keep_completed_with_result = compile_statement(
            results_sql.keep_completed_with_result(), schema
        )
        self.fail = compile_statement(outcomes_sql.fail(), schema)
        self.keep_completed = compile_statement(outcomes_sql.keep_completed(), schema)
        self.heartbeat = compile_statement(leases_sql.heartbeat(), schema)
        self.held_leases = compile_statement(leases_sql.held_leases(), schema)
        self.notify = compile_statement(enqueue_sql.notify(), schema)
        self.release = compile_statement(outcomes_sql.release(), schema)
        self.snooze = compile_statement(outcomes_sql.snooze(), schema)
        self.finish_cancelled = compile_statement(outcomes_sql.finish_cancelled(), schema)
        self.reap = compile_statement(leases_sql.reap(), schema)
        self.release_orphans = compile_statement(leases_sql.release_orphans(), schema)
        self.lock_keys = compile_statement(scans_sql.lock_keys(), schema)
        self.claim_keyed = compile_statement(
            claim_sql.claim_jobs(keyed=True, meta=meta, due_at=timed), schema
        )
        self.claimable_queues = compile_statement(scans_sql.claimable_queues(), schema)
        # The rate limited claim (sqla_jobs.worker.rated), in its order.
        self.lock_rate_limiters = compile_statement(rate_limits_sql.lock_rate_limiters(), schema)
        self.create_rate_limiters = compile_statement(limiters_sql.create_rate_limiters(), schema)
        self.lock_rated_concurrency_keys = compile_statement(
            rate_limits_sql.lock_rated_concurrency_keys(), schema
        )
        self.claim_rated = compile_statement(
            claim_sql.claim_jobs(keyed=False, rated=True, meta=meta, due_at=timed), schema
        )
        self.log_rate_starts = compile_statement(rate_limits_sql.log_rate_starts(), schema)
        self.rate_waits = compile_statement(rate_limits_sql.rate_waits(), schema)
        self.record_step = compile_statement(leases_sql.record_step(), schema)
        self.deferred_job_triggers = compile_statement(catalog_sql.deferred_job_triggers(), schema)
        #: The job table's name, as the catalog statements take it.
        self.job_table = tables_sql.job_table_name(schema)
