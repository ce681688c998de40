"""The engine and the sessionmaker: one for the web app, the worker's handlers and the migrations.

``DATABASE_URL`` is the same variable the ``sqla-jobs`` command reads. sqla-jobs accepts every
SQLAlchemy form of a PostgreSQL URL, but a plain ``postgresql://`` makes SQLAlchemy itself load
psycopg2, which this project does not install: so a URL that names no driver gets psycopg 3's.
"""

from __future__ import annotations

import os

from sqlalchemy import URL, create_engine, make_url
from sqlalchemy.orm import sessionmaker

DEFAULT_URL = "postgresql+psycopg://localhost/shop"


def database_url(url: str | None = None) -> URL:
    """``url`` (else ``$DATABASE_URL``, else a local database ``shop``) on the psycopg 3 driver
    when it names no driver."""
    parsed = make_url(url or os.environ.get("DATABASE_URL") or DEFAULT_URL)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


# No connection is opened here: the first query opens one.
engine = create_engine(database_url())
#: The application's sessions; `sqla-jobs worker --sessionmaker shop.db:SessionLocal` gives the
#: handlers that take a session theirs from it.
SessionLocal = sessionmaker(engine)
