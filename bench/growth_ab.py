"""Alternated before/after of a growth backlog's drain: ``python -m bench.growth_ab BEFORE AFTER``.

The growth bench's drain of the first 20k jobs beside a backlog (``--backlog scheduled``: 2M jobs
scheduled a day ahead; any name of ``bench.growth.backlogs``), for two checkouts of the
repository. Each round runs each tree once, in a rotated order: a subprocess with ``cwd`` and
``PYTHONPATH`` set to the tree loads the backlog into fresh sqla-jobs and baseline databases with
the tree's own schema and loader, then drains ``--reps`` copies of each, sqla-jobs and the batched
loop alternately. Prints each drain, then for each tree the median of its same-repetition ratios
to the batched loop on the same rows. The pickup and the idle CPU of ``--only growth`` are left
out: this is the drain alone. Run it through ``/work/bin/with-bench`` (or on an otherwise idle
machine); ``DATABASE_URL`` names the server.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from .trees import run_in_tree

_ONE = """
import contextlib, json, sys
from bench import growth
from bench.dbs import connect, fresh_database
from bench.settings import Sizes
url, name, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
backlog = next(b for b in growth.backlogs(Sizes()) if b.name == name)
rates = {"sqla_jobs": [], "baseline": []}
with contextlib.ExitStack() as stack:
    templates = {}
    for subject in rates:
        templates[subject] = stack.enter_context(fresh_database(url, subject))
        with connect(templates[subject]) as conn:
            growth.load(conn, subject, backlog)
    for rep in range(reps):
        for subject in list(rates) if rep % 2 == 0 else list(rates)[::-1]:
            with growth.copy_of(url, templates[subject], reuse=rep == reps - 1) as db:
                keyed = bool(backlog.keys) and subject == "sqla_jobs"
                drained = growth.drain_first(db, growth.IMPL[subject], backlog.drain, keyed=keyed)
            rates[subject].append(drained["rate"])
print(json.dumps(rates))
"""


def run_tree(tree: Path, backlog: str, reps: int) -> dict[str, list[float]]:
    """One tree's drains of ``backlog``: jobs/s by subject, one per repetition."""
    args = (os.environ["DATABASE_URL"], backlog, str(reps))
    rates: dict[str, list[float]] = run_in_tree(tree, _ONE, *args)
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.growth_ab", description=__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--backlog", default="scheduled")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    ratios: dict[str, list[float]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
        for name in order:
            rates = run_tree(trees[name], args.backlog, args.reps)
            pairs = list(zip(rates["sqla_jobs"], rates["baseline"], strict=True))
            ratios[name] += [s / b for s, b in pairs]
            drains = ", ".join(f"{s:,.0f} / {b:,.0f}" for s, b in pairs)
            print(
                f"round {round_ + 1} {name}: sqla-jobs / batched jobs/s {drains}; "
                f"median ratio {statistics.median(s / b for s, b in pairs):.2f}x",
                flush=True,
            )
    summary = ", ".join(
        f"{name} {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"
        for name, r in ratios.items()
    )
    print(
        f"{args.backlog}, {args.rounds} rounds of {args.reps} repetitions, sqla-jobs against the "
        f"batched loop on the same rows (median of same-repetition ratios): {summary}"
    )


if __name__ == "__main__":
    main()
