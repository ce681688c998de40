"""The caller's session, whatever holds it: a ``Session``, or a ``scoped_session`` (Flask-SQLAlchemy's
``db.session``) standing for the current thread's ``Session``; likewise ``AsyncSession`` and
``async_scoped_session``.

The public calls resolve a scoped session here, once, and everything below them works on the real
``Session``: a scoped session proxies only part of the Session's interface (no
``get_transaction``, no ``run_sync``), and the job must ride the very transaction the caller's other
writes ride, which is the current Session's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, scoped_session

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session


def current(session: Session | scoped_session[Any]) -> Session:
    """``session`` itself, or the scoped session's current ``Session`` (created by its factory if
    this scope has none yet, as any use of the scoped session would).

    The public signatures say ``scoped_session[Any]``, not ``scoped_session[Session]``: the class
    is invariant in its session type, so Flask-SQLAlchemy's
    ``scoped_session[flask_sqlalchemy.session.Session]`` would not type-check against the latter.
    """
    if isinstance(session, scoped_session):
        resolved: Session = session()
        return resolved
    return session


def current_async(session: AsyncSession | async_scoped_session[Any]) -> AsyncSession:
    """:func:`current` for an ``AsyncSession`` or an ``async_scoped_session``."""
    # Imported here: only the async calls need it, and their caller has imported it already.
    from sqlalchemy.ext.asyncio import async_scoped_session

    if isinstance(session, async_scoped_session):
        resolved: AsyncSession = session()
        return resolved
    return session
