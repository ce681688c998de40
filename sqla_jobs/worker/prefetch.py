"""How many jobs a worker claims ahead of its free slots: pure sizing from the handlers' run time.

Prefetched jobs let a busy worker claim and complete in batches (one round trip per batch), but
only pay while handlers are short: behind long handlers they would wait, and be given back (two
more row versions each). So the automatic prefetch holds what the slots finish in about
:data:`HORIZON` seconds at the average run time, and nothing once handlers average over
:data:`SHORT_JOB`.
"""

from __future__ import annotations

#: Handlers faster than this on average get an automatic prefetch (seconds).
SHORT_JOB = 0.05
#: The automatic prefetch holds about this much work per slot (seconds of average run time)...
HORIZON = 0.1
#: ... and at most this many jobs.
CAP = 2048
#: ... and a claim asks for at most this many of them: two claims of a busy worker can be in
#: flight at once; fewer, bigger claims spend less of a 2-core machine on round trips.
CLAIM_CAP = 1024
#: The average is re-read for every one of the first runs, then every this many.
_RESIZE_EVERY = 8


class Prefetch:
    """The prefetch and the claim limit in force, resized as the average run time moves.

    ``fixed`` (a number) turns the automatic sizing off; ``batch_size`` fixes the claim limit.
    """

    def __init__(self, concurrency: int, fixed: int | None = None, batch_size: int | None = None):
        self._concurrency = concurrency
        self._fixed = fixed
        self._batch_size = batch_size
        self._auto = 0
        self._runs = 0
        #: Moving average of handler run time (seconds); None until a job has finished.
        self.avg_runtime: float | None = None
        #: Jobs held beyond the slots (attributes, not calls: read once per job).
        self.size = 0
        #: The most a claim asks for.
        self.limit = 0
        self._apply()

    def observe(self, runtime: float) -> None:
        """A handler ran for ``runtime`` seconds."""
        avg = self.avg_runtime
        self.avg_runtime = avg = runtime if avg is None else 0.9 * avg + 0.1 * runtime
        self._runs += 1
        if self._runs < _RESIZE_EVERY or not self._runs % _RESIZE_EVERY:
            self.resize(avg)

    def resize(self, avg_runtime: float) -> None:
        """Size the automatic prefetch for handlers averaging ``avg_runtime`` seconds: no-op jobs
        get the cap (big claims, few round trips), 10 ms jobs a few per slot, long jobs none."""
        if avg_runtime > SHORT_JOB:
            auto = 0
        else:
            per_slot = HORIZON / max(avg_runtime, 1e-6)
            auto = min(CAP, int(self._concurrency * per_slot))
        if auto != self._auto:
            self._auto = auto
            self._apply()

    def _apply(self) -> None:
        self.size = self._fixed if self._fixed is not None else self._auto
        self.limit = self._batch_size or (self._concurrency + min(CLAIM_CAP, self.size))
