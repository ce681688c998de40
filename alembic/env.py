"""This repository's Alembic environment: it runs the revisions shipped in ``sqla_jobs``.

The database comes from ``DATABASE_URL``; see alembic.ini.
"""

from sqla_jobs.migrations._env import run

run()
