"""Talking to PostgreSQL: database URLs for any driver (:mod:`~sqla_jobs.db.urls`), the raw psycopg
connections a worker's threads open and how each comes back after a loss
(:mod:`~sqla_jobs.db.connections`), the caller's session whatever holds it
(:mod:`~sqla_jobs.db.sessions`), and the check that the queue table is there before a command
touches it (:mod:`~sqla_jobs.db.preflight`), and the single enqueue's INSERT sent straight to
the driver when nothing listens (:mod:`~sqla_jobs.db.direct`).

No threads of its own. Imports :mod:`sqla_jobs.sql`, :mod:`sqla_jobs.model` and
:mod:`sqla_jobs.errors` only.
"""
