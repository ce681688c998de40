"""Durable steps: record each step's result with its job, in its own short transaction.

A handler's ``ctx.step(name, fn)`` runs ``fn`` once and records its JSON result on the job row; when
the job runs again (after a failure or a crash), recorded steps return their result without running.
The record is fenced on the lease token, so a worker that lost its lease cannot write into the job
another worker now owns.
"""

from __future__ import annotations

import queue
import uuid

import psycopg

from ._connections import CONNECTION_ERRORS
from ._db import KEEPALIVES
from ._sql import Compiled


class StepWriter:
    """A small pool of autocommit connections that write step results for one worker's handlers.

    Sync handlers call it from their threads; async handlers through ``asyncio.to_thread``.
    """

    def __init__(
        self,
        conninfo: str,
        statement: Compiled,
        application_name: str,
        *,
        prepare_threshold: int | None = 5,
    ) -> None:
        self._conninfo = conninfo
        self._application_name = application_name
        self._prepare_threshold = prepare_threshold
        self._statement = statement
        self._idle: queue.LifoQueue[psycopg.Connection[tuple[object, ...]]] = queue.LifoQueue()

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

    def _take(self) -> psycopg.Connection[tuple[object, ...]]:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            return psycopg.connect(
                self._conninfo,
                **KEEPALIVES,
                autocommit=True,
                connect_timeout=10,
                application_name=self._application_name,
                prepare_threshold=self._prepare_threshold,
            )
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
