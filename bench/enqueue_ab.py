"""The single-enqueue loops of :mod:`bench.enqueue` alone, for quick iteration:
``python -m bench.enqueue_ab [--loops enqueue,core_floor,...] [--n 3000] [--repeat 5]``.

Runs the chosen one-transaction-per-job loops (:data:`bench.enqueue_loops.SINGLE`) in this
process as ``python -m bench`` does: each repetition all of them at once, each in a fresh
database, a block at a time in turns (:func:`bench.enqueue_loops.interleaved`). Prints each loop's
txn/s, then for each pair of :data:`PAIRS` present the median of the same-repetition ratios with
their range. The server is ``DATABASE_URL``'s (else an embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from devdb import database_url

from .enqueue_loops import SINGLE, interleaved

#: The ratios printed: (loop, the loop it is compared with).
PAIRS = (
    ("enqueue", "core_floor"),
    ("enqueue", "insert_floor"),
    ("business_job", "business_row"),
    ("enqueue_none", "core_floor"),
    ("core_floor", "insert_floor"),
)
DEFAULT_LOOPS = "enqueue,core_floor,insert_floor,business_job,business_row"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.enqueue_ab", description=__doc__)
    parser.add_argument("--loops", default=DEFAULT_LOOPS, help=f"default {DEFAULT_LOOPS}")
    parser.add_argument("--n", type=int, default=3000, help="transactions per loop")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.loops.split(",") if n.strip()]
    unknown = [n for n in names if n not in SINGLE]
    if unknown:
        parser.error(f"unknown loop {', '.join(unknown)}; choose from {', '.join(SINGLE)}")
    rates: dict[str, list[float]] = {n: [] for n in names}
    with database_url() as server:
        for rep in range(args.repeat):
            got = interleaved(server, names, args.n, first=rep)
            for name in names:
                rates[name].append(got[name])
            print(
                f"rep {rep + 1}: "
                + ", ".join(f"{name} {got[name]:,.0f}" for name in names)
                + f" txn/s (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    for name in names:
        print(f"{name:>16}: median {statistics.median(rates[name]):7,.0f} txn/s")
    for a, b in PAIRS:
        if a in rates and b in rates:
            ratios = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
            print(
                f"{a} / {b}: {statistics.median(ratios):.3f}x "
                f"[{min(ratios):.3f}-{max(ratios):.3f}] ({', '.join(f'{r:.2f}' for r in ratios)})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
