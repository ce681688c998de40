"""What an operator does to jobs and queues, each in the caller's transaction: retry, cancel,
delete, get a job (:mod:`~sqla_jobs.operations.jobs`); pause, resume and forget a queue, and list
the queues known (:mod:`~sqla_jobs.operations.queues`); and their half of
the :class:`~sqla_jobs.Jobs` facade (:mod:`~sqla_jobs.operations.facade`), and the one-line
account of an operation that the CLI and the dashboard both print (``said``).

No threads, no connections of its own. Imports the domain, :mod:`sqla_jobs.db`,
:mod:`sqla_jobs.sql` and the bottom layer.
"""
