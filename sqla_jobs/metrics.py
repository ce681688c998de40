"""Prometheus metrics of a worker (the ``metrics`` extra: ``pip install 'sqla-jobs[metrics]'``).

Give a worker a :class:`Metrics` and it counts each run's outcome, times each run and each job's
wait from its ``run_at`` to its start, counts the crashes its reaper finds, and (on the one worker
elected across all machines) samples the queues' depth::

    from sqla_jobs.metrics import Metrics

    Worker(jobs, url, metrics=Metrics(port=9100))              # /metrics and /healthz on 127.0.0.1
    Worker(jobs, url, metrics=Metrics(registry=REGISTRY))      # in your own registry, served by you

``sqla-jobs worker ... --metrics-port 9100`` does the first. Only this module (and the private
ones behind it in ``sqla_jobs/observe/``: ``metrics``, ``collectors``, ``metrics_http``) imports
prometheus_client: a worker without metrics never loads it, and pays one ``is None`` test per job
start and end. Labels are the kind, the queue, the outcome and the state: never a job's id,
payload or error text.
"""

from __future__ import annotations

from sqla_jobs.observe.metrics import DURATION_BUCKETS, OUTCOMES, PICKUP_BUCKETS, Metrics

__all__ = ["DURATION_BUCKETS", "OUTCOMES", "PICKUP_BUCKETS", "Metrics"]
