"""The worker's statements, compiled once from :mod:`sqla_jobs.sql.statements` for psycopg.

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

from sqla_jobs.sql import statements

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


#: The claim and the keyed claim, by (meta, timed): each column only for a worker that reads it.
_CLAIMS = {
    (False, False): (statements.claim, statements.claim_keyed),
    (True, False): (statements.claim_with_meta, statements.claim_keyed_with_meta),
    (False, True): (statements.claim_with_due_at, statements.claim_keyed_with_due_at),
    (True, True): (
        statements.claim_with_meta_and_due_at,
        statements.claim_keyed_with_meta_and_due_at,
    ),
}


class WorkerSQL:
    """Every statement a worker runs, compiled for one schema; ``meta``: the claims return each
    job's meta too (for a middleware that reads ``ctx.meta``); ``timed``: and when each job
    became due, last (for the metrics' pickup delay)."""

    def __init__(self, schema: str | None, meta: bool = False, timed: bool = False) -> None:
        claim, claim_keyed = _CLAIMS[meta, timed]
        #: Whether the claims return each job's meta (a 15th column, after ClaimedJob's).
        self.meta = meta
        #: Whether the claims return each job's due_at (the last column).
        self.timed = timed
        self.claim = compile_statement(claim(), schema)
        self.complete = compile_statement(statements.complete(), schema)
        self.complete_into_history = compile_statement(statements.complete_into_history(), schema)
        self.fail = compile_statement(statements.fail(), schema)
        self.keep_completed = compile_statement(statements.keep_completed(), schema)
        self.heartbeat = compile_statement(statements.heartbeat(), schema)
        self.held_leases = compile_statement(statements.held_leases(), schema)
        self.notify = compile_statement(statements.notify(), schema)
        self.release = compile_statement(statements.release(), schema)
        self.snooze = compile_statement(statements.snooze(), schema)
        self.finish_cancelled = compile_statement(statements.finish_cancelled(), schema)
        self.reap = compile_statement(statements.reap(), schema)
        self.lock_keys = compile_statement(statements.lock_keys(), schema)
        self.claim_keyed = compile_statement(claim_keyed(), schema)
        self.claimable_queues = compile_statement(statements.claimable_queues(), schema)
        self.record_step = compile_statement(statements.record_step(), schema)
        self.deferred_job_triggers = compile_statement(statements.deferred_job_triggers(), schema)
        #: The job table's name, as the catalog statements take it.
        self.job_table = statements.job_table_name(schema)
