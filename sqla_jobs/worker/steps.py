"""Durable steps: record each step's result with its job, in its own short transaction.

A handler's ``ctx.step(name, fn)`` runs ``fn`` once and records its JSON result on the job row; when
the job runs again (after a failure or a crash), recorded steps return their result without running.
The record is fenced on the lease token, so a worker that lost its lease cannot write into the job
another worker now owns.
"""

from __future__ import annotations

import json
import queue
import uuid
from typing import Any, cast

import psycopg

from sqla_jobs.db.connections import Conn, Connector, should_reconnect
from sqla_jobs.sql.compiled import Compiled


class StepWriter:
    """A small pool of autocommit connections that write step results for one worker's handlers.

    Sync handlers call it from their threads; async handlers through ``asyncio.to_thread``.
    """

    def __init__(
        self, connector: Connector, statement: Compiled, parents: Compiled | None = None
    ) -> None:
        self._connector = connector
        self._statement = statement
        self._parents = parents
        self._idle: queue.LifoQueue[Conn] = queue.LifoQueue()

    def __call__(self, job_id: int, token: uuid.UUID, name: str, value_json: str) -> bool:
        """Record ``name = value_json`` on the job; False if the lease is no longer ours."""
        params = self._statement.params(id=job_id, token=token, name=name, value=value_json)
        return bool(self._run(self._statement.sql, params))

    def parent_results(self, job_id: int) -> dict[int, Any]:
        """The stored results of job ``job_id``'s parents (``ctx.parent_results``), on the same
        small pool."""
        assert self._parents is not None
        rows = self._run(self._parents.sql, self._parents.params(child=job_id))
        return {cast(int, row[0]): json.loads(cast(str, row[1])) for row in rows}

    def _run(self, sql: str, params: Any) -> list[Any]:
        """``sql``'s rows on a pooled connection; once more on a fresh one if it was lost."""
        for attempt in (1, 2):
            conn = self._take()
            try:
                rows = conn.execute(sql, params).fetchall()
            except psycopg.Error as exc:
                if not should_reconnect(exc):
                    raise
                conn.close()
                if attempt == 2:
                    raise
                continue
            self._idle.put(conn)
            return rows
        raise AssertionError("unreachable")  # pragma: no cover

    def _take(self) -> Conn:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            return self._connector.connect("steps")
        if conn.closed:
            return self._take()
        return conn

    def close(self) -> None:
        """Close the idle connections."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
