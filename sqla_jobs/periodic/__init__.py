"""Periodic jobs: when a schedule ticks (:mod:`~sqla_jobs.periodic.schedule`), how an application
declares them on its :class:`~sqla_jobs.Jobs` (:mod:`~sqla_jobs.periodic.declare`), what an
operator does to them (:mod:`~sqla_jobs.periodic.ops`), and the scheduler thread every worker runs
(:mod:`~sqla_jobs.periodic.scheduler`, one connection of its own; no leader: a compare-and-set on
each schedule's row decides which scheduler enqueues a tick).

Imports the domain, :mod:`sqla_jobs.db`, :mod:`sqla_jobs.sql` and the bottom layer. The scheduler
enqueues through a callable it is given (the worker passes ``Jobs.enqueue``), so nothing here
imports the facade.
"""
