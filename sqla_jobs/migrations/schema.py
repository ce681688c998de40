"""The schema the shipped migrations run in, chosen without touching the revisions.

Precedence: ``alembic -x sqla_jobs_schema=NAME``, then ``sqla_jobs_schema`` in the ``[alembic]``
section of alembic.ini (or ``config.attributes["sqla_jobs_schema"]`` for programmatic use), then
None: the connection's search_path. The schema must already exist.
"""

from __future__ import annotations

from alembic import context

from sqla_jobs.kinds import NAME_RE


def migration_schema() -> str | None:
    """The schema for sqla-jobs' tables in the running migration (None: the search_path's)."""
    x = context.get_x_argument(as_dictionary=True).get("sqla_jobs_schema")
    config = context.config
    value = (
        x
        or config.attributes.get("sqla_jobs_schema")
        or config.get_main_option("sqla_jobs_schema")
        or None
    )
    if value is not None and not NAME_RE.fullmatch(value):
        raise ValueError(f"invalid sqla_jobs_schema {value!r}")
    return value
