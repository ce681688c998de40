"""What a worker shows of itself and what an operator reads: Prometheus metrics
(:mod:`~sqla_jobs.observe.metrics`, public as :mod:`sqla_jobs.metrics`), OpenTelemetry tracing
(:mod:`~sqla_jobs.observe.tracing`, public as :mod:`sqla_jobs.otel`), per-minute throughput
(:mod:`~sqla_jobs.observe.tally` writes it, :mod:`~sqla_jobs.observe.throughput` reads it,
public as :mod:`sqla_jobs.throughput`), the registry of live workers
(:mod:`~sqla_jobs.observe.registry`), the queue sampler (:mod:`~sqla_jobs.observe.sampler`) and
the one-screen queue statistics (:mod:`~sqla_jobs.observe.stats`).

The registry, tally and sampler run in the worker's reaper and sampler threads, on their
connections; the metrics HTTP server has a thread of its own. Imports the :class:`~sqla_jobs.Jobs`
facade and everything under it; never the worker, the CLI or the dashboard.
"""
