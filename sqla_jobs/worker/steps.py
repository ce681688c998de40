"""Durable steps: record each step's result with its job, in its own short transaction.

A handler's ``ctx.step(name, fn)`` runs ``fn`` once and records its JSON result on the job row; when
the job runs again (after a failure or a crash), recorded steps return their result without running.
The record is fenced on the lease token, so a worker that lost its lease cannot write into the job
another worker now owns.
"""

from __future__ import annotations

import queue
import uuid

from sqla_jobs.db.connections import CONNECTION_ERRORS, Conn, Connector
from sqla_jobs.sql.compiled import Compiled


class StepWriter:
    """A small pool of autocommit connections that write step results for one worker's handlers.

    Sync handlers call it from their threads; async handlers through ``asyncio.to_thread``.
    """

    def __init__(self, connector: Connector, statement: Compiled) -> None:
        self._connector = connector
        self._statement = statement
        self._idle: queue.LifoQueue[Conn] = queue.LifoQueue()

    def __call__(self, job_id: int, token: uuid.UUID, name: str, value_json: str) -> bool:
        """Record ``name = value_json`` on the job; False if the lease is no longer ours."""
        params = self._statement.params(id=job_id, token=token, name=name, value=value_json)
        for attempt in (1, 2):
            conn = self._take()
            try:
                row = conn.execute(self._statement.sql, params).fetchone()
            except CONNECTION_ERRORS:
                conn.close()
                if attempt == 2:
                    raise
                continue
            self._idle.put(conn)
            return row is not None
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
