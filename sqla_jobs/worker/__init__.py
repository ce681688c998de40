"""The worker: :class:`Worker` is the facade (:mod:`~sqla_jobs.worker.facade`); its parts claim,
run and finish jobs.

The event loop's side (:mod:`~sqla_jobs.worker.parts` wires it): the fetch loop
(:mod:`~sqla_jobs.worker.fetch`) claims through the lanes (:mod:`~sqla_jobs.worker.lanes`, the
claim connections, which also carry the outcomes :mod:`~sqla_jobs.worker.writes` batches) into the
holdings (:mod:`~sqla_jobs.worker.holdings`); the slots (:mod:`~sqla_jobs.worker.slots`) run the
handlers, sync ones on runner threads (:mod:`~sqla_jobs.worker.threads`); handlers that take a
Session commit with their completion (:mod:`~sqla_jobs.worker.session_runs`).

The threads (:mod:`~sqla_jobs.worker.services` starts them, each with a connection of its own):
the listener (:mod:`~sqla_jobs.worker.listener`, which also makes an idle worker's next claim,
:mod:`~sqla_jobs.worker.handoff`), the heartbeats (:mod:`~sqla_jobs.worker.leases`), the reaper
(:mod:`~sqla_jobs.worker.reaper`), the pruner (:mod:`~sqla_jobs.worker.pruner`), and the
scheduler of :mod:`sqla_jobs.periodic`. :mod:`~sqla_jobs.worker.startup` waits for a primary and runs the checks
before the threads start; :mod:`~sqla_jobs.worker.shutdown` is the graceful stop. :mod:`~sqla_jobs.worker.heap` sets the
startup heap of a process that only runs a worker aside from garbage collection (``sqla-jobs
worker`` calls it).

Imports everything below it (observe, the facade, periodic, enqueue, db, sql); never the CLI, the
dashboard or ``sqla_jobs.testing``.
"""

from __future__ import annotations

from sqla_jobs.worker.facade import EXIT_FORCED, EXIT_STUCK, HandlerTimeout, Worker

__all__ = ["EXIT_FORCED", "EXIT_STUCK", "HandlerTimeout", "Worker"]
