"""What an operator does to jobs and queues, each in the caller's transaction: retry, cancel,
delete, pause and resume a queue, get a job (:mod:`~sqla_jobs.operations.jobs`), and their half of
the :class:`~sqla_jobs.Jobs` facade (:mod:`~sqla_jobs.operations.facade`); and the listings the
CLI and the dashboard both read (:mod:`~sqla_jobs.operations.listings`).

No threads, no connections of its own. Imports the domain, :mod:`sqla_jobs.db`,
:mod:`sqla_jobs.sql` and the bottom layer.
"""
