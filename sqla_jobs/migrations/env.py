"""Alembic runs this file for script_location ``sqla_jobs:migrations``."""

from sqla_jobs.migrations._env import run

run()
