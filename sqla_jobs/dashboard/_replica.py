"""Where the pages read: the read URL's server (a replica) when the app has one, else the primary.

Every action writes on the primary, and then notes the primary's WAL position in a signed cookie:
until the replica has replayed past it, the pages read from the primary, so the page after an
action shows what it changed (if the primary cannot be reached, the replica's page says it is
behind). A read the replica's recovery cancels runs once more (:mod:`sqla_jobs.db.replica`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session
from starlette.requests import Request
from starlette.responses import Response

from sqla_jobs.dashboard._csrf import cookie_path
from sqla_jobs.db.replica import Position, position, retrying_conflicts

T = TypeVar("T")
log = logging.getLogger("sqla_jobs.dashboard")

COOKIE = "sqla_jobs_wal"
#: Seconds an action's mark is kept: a replica that far behind is out of order, not lagging.
MARK_SECONDS = 600


class ReplicaUnavailable(Exception):
    """The read URL's server cannot be reached; the message says which and why."""


@dataclass(frozen=True)
class Source:
    """Where a page was read, and what the page says about it."""

    #: "primary", "replica", or "read URL" (a read URL that points at a primary).
    server: str
    #: A note the page shows above its content (the replica is behind), or None.
    note: str | None = None
    #: The WAL position of what the page shows (None: the primary's, not asked).
    lsn: str | None = None


class Reads:
    """Sends one dashboard's page reads to its replica (``replica`` None: all to ``primary``)."""

    def __init__(self, primary: Engine, replica: Engine | None, secret: bytes, where: str) -> None:
        self.primary = primary
        self.replica = replica
        self._secret = secret
        #: The replica as errors name it (the read URL, password hidden).
        self._where = where

    def read(self, request: Request, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` in one read transaction, on the server this request should read from;
        where it read is left in ``request.state.source`` for the page."""
        if self.replica is None:
            request.state.source = None
            return _run(self.primary, fn)
        mark = self._mark(request)
        replica = self.replica

        def on_replica() -> tuple[Position, bool, T | None]:
            with Session(replica, expire_on_commit=False) as session, session.begin():
                at = position(session)
                if mark is not None and not at.reached(mark):
                    return at, False, None
                return at, True, fn(session)

        try:
            at, served, result = retrying_conflicts(on_replica, "the replica")
        except OperationalError as exc:
            first = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else "?"
            raise ReplicaUnavailable(
                f"cannot reach the read replica at {self._where}: {first}"
            ) from None
        shown = None if at.lsn is None else _lsn_text(at.lsn)
        if served:
            request.state.source = Source("replica" if at.standby else "read URL", None, shown)
            request.state.clear_mark = mark is not None
            return cast(T, result)  # fn's own result, None included
        try:
            result = _run(self.primary, fn)
        except OperationalError:
            # The primary is away (failing over): the replica's page, said to be behind.
            request.state.source = Source(
                "replica",
                "The replica has not replayed your last action yet, and the primary cannot be "
                "reached: this page may not show what that action changed.",
                shown,
            )
            return retrying_conflicts(lambda: _run(replica, fn), "the replica")
        request.state.source = Source(
            "primary", "Read from the primary: the replica has not replayed your last action yet."
        )
        return result

    def written(self, session: Session) -> int | None:
        """After an action committed in ``session`` (on the primary): the primary's WAL position,
        which the next pages must have replayed (None: no replica, or the primary did not say)."""
        if self.replica is None:
            return None
        try:
            at = position(session)
        except DBAPIError:
            return None  # the action is done; the next pages may merely lag behind it
        return None if at.standby else at.lsn

    def remember(self, request: Request, response: Response, lsn: int | None) -> None:
        """Leave the mark ``lsn`` (:meth:`written`) for the next pages."""
        if lsn is None:
            return
        value = str(lsn)
        response.set_cookie(
            COOKIE,
            f"{value}.{self._sign(value)}",
            max_age=MARK_SECONDS,
            path=cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def settle(self, request: Request, response: Response) -> None:
        """Drop the mark once a page read from a replica that had replayed past it."""
        if getattr(request.state, "clear_mark", False):
            response.delete_cookie(COOKIE, path=cookie_path(request))

    def _mark(self, request: Request) -> int | None:
        value, _, signature = request.cookies.get(COOKIE, "").partition(".")
        if not value.isdigit() or not hmac.compare_digest(signature, self._sign(value)):
            return None
        return int(value)

    def _sign(self, value: str) -> str:
        return hmac.new(self._secret, b"wal:" + value.encode(), hashlib.sha256).hexdigest()


def _run(engine: Engine, fn: Callable[[Session], T]) -> T:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return fn(session)


def _lsn_text(number: int) -> str:
    return f"{number >> 32:X}/{number & 0xFFFFFFFF:X}"
