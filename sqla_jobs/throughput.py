"""Throughput over the last minutes, as the workers recorded it: for dashboards and reports.

Each worker adds what it finished to ``sqla_jobs_throughput`` once per beat of its reaper (see
:class:`sqla_jobs.Worker`'s ``throughput``); completed jobs are deleted, so these rows are the
record of what ran. A count lands in the minute, by the database's clock, in which its worker
wrote it: up to one reap interval after the run ended.
"""

from __future__ import annotations

from sqla_jobs.observe.throughput import Minute, recent

__all__ = ["Minute", "recent"]
