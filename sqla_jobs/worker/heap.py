"""The heap of a process that runs a worker and nothing else: set aside once it has started, and
collected less often.

A busy worker allocates a few container objects per job (its claimed row, context, outcome,
decoded payload), and each claim brings hundreds of jobs that stay alive until they ran. Every 700
net allocations (the young generation's default threshold) the cyclic garbage collector ran, and
each time the older generations filled it walked them too; a full collection walks every object
the process holds, most of them the modules, SQLAlchemy and pydantic state loaded at startup,
which are never garbage. Frozen (:func:`gc.freeze`), those are left out of every later
collection; with the young threshold at :data:`YOUNG_THRESHOLD` a drain's jobs, which reference
counting frees, no longer start collections at all (bench/README.md). The worker's own code
makes no garbage cycles per job, so the collector still runs, only less often.

Only for a process that exists to run the worker (``sqla-jobs worker``): in an application's own
process, freezing the heap would also keep any of its objects that later end up in a garbage
cycle, and the thresholds are the application's to set, so :class:`~sqla_jobs.Worker` never
touches the collector on its own.
"""

from __future__ import annotations

import gc

#: Net allocations of container objects between two young collections (CPython's default: 700).
#: Above what one claim brings (up to 1,024 jobs, a few objects each), so taking a claim's jobs in
#: no longer triggers walks of them.
YOUNG_THRESHOLD = 10_000


def tune_worker_heap() -> None:
    """Collect what starting up left behind, exclude every object alive now from future
    collections (they are still freed by reference counting), and raise the young generation's
    threshold to :data:`YOUNG_THRESHOLD`. Call once, right before the worker runs; calling again
    freezes what was allocated since."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
