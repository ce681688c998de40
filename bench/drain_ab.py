"""Alternated before/after of the drain: ``python -m bench.drain_ab BEFORE AFTER``.

Each repetition drains the same number of pre-enqueued no-op jobs with the worker of each tree
(two checkouts of the repository) and with the batched SQL loop, in an order rotated each
repetition, every drain in a subprocess with ``cwd`` and ``PYTHONPATH`` set to its tree, so each
side imports its own ``sqla_jobs`` and ``bench``. The batched loop runs from the first tree. Prints
each repetition and the medians of the same-repetition ratios (after / before, and each tree
against the batched loop), with the worker's and the server's CPU per job; run it through
``/work/bin/with-bench`` (or on an otherwise idle machine). ``DATABASE_URL`` names the server.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from .trees import run_in_tree

_ONE = """
import json, sys
from bench.drain import drain_once
from bench.settings import Context, Sizes
from pathlib import Path
import tempfile
ctx = Context(server_url=sys.argv[1], sizes=Sizes(), repeat=1, quick=False,
              results_dir=Path(tempfile.gettempdir()), stamp="ab")
print(json.dumps(drain_once(ctx, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
                            limited=sys.argv[6] == "limited")))
"""


def drain(
    tree: Path, impl: str, concurrency: int, processes: int, jobs: int, limited: bool = False
) -> dict[str, float]:
    """One drain by ``impl`` with ``tree``'s code: jobs/s and CPU per job."""
    args = [os.environ["DATABASE_URL"], impl, str(concurrency), str(processes), str(jobs)]
    args.append("limited" if limited else "plain")
    result: dict[str, float] = run_in_tree(tree, _ONE, *args)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.drain_ab", description=__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    parser.add_argument("-p", "--processes", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument(
        "--after-limited",
        action="store_true",
        help="the after tree drains a rate limited kind (a limit never reached)",
    )
    parser.add_argument(
        "--limited",
        action="store_true",
        help="both trees drain a rate limited kind (a limit never reached)",
    )
    args = parser.parse_args(argv)
    sides = {
        "before": (args.before.resolve(), "sqla"),
        "after": (args.after.resolve(), "sqla"),
        "batched": (args.before.resolve(), "batched"),
    }
    names = list(sides)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for rep in range(args.reps):
        order = names[rep % 3 :] + names[: rep % 3]
        for name in order:
            tree, impl = sides[name]
            limited = impl == "sqla" and (args.limited or (args.after_limited and name == "after"))
            runs[name].append(
                drain(tree, impl, args.concurrency, args.processes, args.jobs, limited)
            )
        line = "  ".join(
            f"{n} {runs[n][-1]['rate']:8.0f}/s {runs[n][-1]['cpu_us_per_job']:5.1f}us"
            for n in names
        )
        print(f"rep {rep + 1} ({' '.join(order)}): {line}", flush=True)

    def ratio(a: str, b: str) -> float:
        return statistics.median(
            x["rate"] / y["rate"] for x, y in zip(runs[a], runs[b], strict=True)
        )

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(
        f"c={args.concurrency} p={args.processes} jobs={args.jobs} reps={args.reps}, medians: "
        f"before {med('before', 'rate'):.0f}/s, after {med('after', 'rate'):.0f}/s, "
        f"batched {med('batched', 'rate'):.0f}/s; after/before {ratio('after', 'before'):.2f}x, "
        f"before/batched {ratio('before', 'batched'):.2f}x, "
        f"after/batched {ratio('after', 'batched'):.2f}x; worker CPU us/job before "
        f"{med('before', 'cpu_us_per_job'):.1f}, after {med('after', 'cpu_us_per_job'):.1f}, "
        f"batched {med('batched', 'cpu_us_per_job'):.1f}; server CPU us/job before "
        f"{med('before', 'server_cpu_us_per_job'):.1f}, after "
        f"{med('after', 'server_cpu_us_per_job'):.1f}, "
        f"batched {med('batched', 'server_cpu_us_per_job'):.1f}"
    )


if __name__ == "__main__":
    main()
