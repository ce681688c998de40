"""Enqueue, in the caller's ``Session`` or ``AsyncSession``: validation of the payload and options
(:mod:`~sqla_jobs.enqueue.validate`; a batch's, :mod:`~sqla_jobs.enqueue.validate_many`), the row
(:mod:`~sqla_jobs.enqueue.row`), INSERT and COPY (:mod:`~sqla_jobs.enqueue.insert`,
:mod:`~sqla_jobs.enqueue.copy_rows`), unique jobs by ``ON CONFLICT``
(:mod:`~sqla_jobs.enqueue.unique`), ``depends_on`` (:mod:`~sqla_jobs.enqueue.depends`), and the wakeup at commit (:mod:`~sqla_jobs.enqueue.wakeup`,
sent by the per-process :mod:`~sqla_jobs.enqueue.notifier`: its thread,
:mod:`~sqla_jobs.enqueue.notifier_thread`, and the thread's I/O,
:mod:`~sqla_jobs.enqueue.notifier_conn`).

Runs in the caller's thread, on the caller's connection; the notifier is the only thread, with a
connection of its own. Imports the domain (kinds, unique, context), :mod:`sqla_jobs.hooks`,
:mod:`sqla_jobs.db`, :mod:`sqla_jobs.sql` and the bottom layer; never the worker.
"""
