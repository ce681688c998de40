"""psycopg's own warning when a pipeline or a COPY ends on a connection that is already lost,
left out while a worker runs: its outage account (:mod:`sqla_jobs.db.outage`) says the
connection was lost, once per outage, and the block's own error still reaches the worker.

psycopg logs ``error ignored terminating <AsyncPipeline [BAD]>: the connection is lost`` when the
block inside a pipeline raised and ending the pipeline failed too. In a failover a claim lane
meets exactly that, which would add a line to the one the outage is allowed. Only that message,
and only for an error that means the connection is gone, is left out; every other record of the
``psycopg`` logger passes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, ParamSpec, TypeVar

from sqla_jobs.db.connections import should_reconnect

#: The format psycopg logs it with (``_pipeline.py``, ``_copy.py`` and their async twins).
MESSAGE = "error ignored terminating %r: %s"
_logger = logging.getLogger("psycopg")
_lock = threading.Lock()
_users = 0
P = ParamSpec("P")
T = TypeVar("T")


class LostConnectionEnds(logging.Filter):
    """Leaves out psycopg's "error ignored terminating" for a connection that is gone."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg != MESSAGE or not isinstance(args, tuple) or len(args) != 2:
            return True
        error = args[1]
        return not (isinstance(error, BaseException) and should_reconnect(error))


_FILTER = LostConnectionEnds()


@contextlib.contextmanager
def quiet_lost_connection_ends() -> Iterator[None]:
    """While in this block (in any thread: the filter is the process's), the warning is left out;
    nested and concurrent blocks (several workers in one process) share one filter."""
    global _users
    with _lock:
        if not _users:
            _logger.addFilter(_FILTER)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if not _users:
                _logger.removeFilter(_FILTER)


def quieted(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """The coroutine function ``fn``, run inside :func:`quiet_lost_connection_ends`."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        with quiet_lost_connection_ends():
            return await fn(*args, **kwargs)

    return run
