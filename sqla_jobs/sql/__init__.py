"""The only home of SQL: pure builders of SQLAlchemy Core statements, one module per concern, and
the worker's statements compiled once for psycopg (:mod:`~sqla_jobs.sql.compiled`).

The concerns: :mod:`~sqla_jobs.sql.enqueue` and :mod:`~sqla_jobs.sql.unique` (writing jobs),
:mod:`~sqla_jobs.sql.claim` (one builder, ``claim_jobs``, for every claim variant) over the loose
index scans of :mod:`~sqla_jobs.sql.scans`, with what a claim returns in
:mod:`~sqla_jobs.sql.claimed`, :mod:`~sqla_jobs.sql.outcomes` and
:mod:`~sqla_jobs.sql.leases` (how a run ends, and its lease), :mod:`~sqla_jobs.sql.operations`,
:mod:`~sqla_jobs.sql.schedules`, :mod:`~sqla_jobs.sql.listings` and :mod:`~sqla_jobs.sql.links`,
:mod:`~sqla_jobs.sql.workflows` (job dependencies at enqueue; their triggers are the model's),
:mod:`~sqla_jobs.sql.stats`, :mod:`~sqla_jobs.sql.metrics` and :mod:`~sqla_jobs.sql.workers`
(what observers read and write), :mod:`~sqla_jobs.sql.maintenance` (retention),
:mod:`~sqla_jobs.sql.catalog` (the server's catalog and the migration lock) and
:mod:`~sqla_jobs.sql.testing` (what ``sqla_jobs.testing`` selects); :mod:`~sqla_jobs.sql.tables`
holds what they share and :mod:`~sqla_jobs.sql.columns` the columns enqueue writes.

No I/O and no threads. The bottom layer: imports only :mod:`sqla_jobs.model`,
:mod:`sqla_jobs.errors` and its own modules; every other part of the package takes its SQL from
here, importing the module of the concern (``from sqla_jobs.sql import claim as claim_sql``).
Each module lists its builders in ``__all__``, and each builder's compiled text is pinned by a
golden file, ``tests/sql/<name>.sql`` (``tests/unit/test_sql_builders.py``).
"""
