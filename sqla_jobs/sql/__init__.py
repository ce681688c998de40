"""The only home of SQL: pure builders of SQLAlchemy Core statements, one module per concern, and
the worker's statements compiled once for psycopg (:mod:`~sqla_jobs.sql.compiled`).

No I/O and no threads. Imports only :mod:`sqla_jobs.model` and :mod:`sqla_jobs.errors` (the
bottom layer); every other part of the package takes its SQL from here. Each builder's output is
pinned by a golden file in ``tests/sql/golden/``.
"""
