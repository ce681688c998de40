"""``python -m bench.waiting_claim``: what a claim costs beside a large backlog of waiting jobs.

Creates a scratch database on the server (``--url``, else ``DATABASE_URL``, else an embedded
PostgreSQL for the duration), migrates it and loads 20k jobs due in queue ``default``; measures
the claim (limit 10 and 100) and an idle poll's probe; then adds ``--waiting`` jobs (1M by
default) waiting for a parent in the same queue and kind (job dependencies: state ``waiting``)
and measures again. Each figure is EXPLAIN (ANALYZE, BUFFERS)'s shared buffers and execution time
and the median wall time of 20 runs as a worker sends them; every claim runs in a transaction
rolled back, so each run sees the same table. Prints the plan of the claim with the backlog. The
database is dropped at the end; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse

import psycopg

from devdb import database_url
from sqla_jobs.db.urls import libpq_conninfo

from .dbs import fresh_database
from .growth_sql import Conn, Figures, _claim, _claim_params, _explain, _new, _wall

DUE = (
    "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at)"
    " SELECT 'default', 'bench', '{}', i % 4, now() - interval '1 hour' + i * interval '1 ms'"
    " FROM generate_series(1, 20000) i"
)
#: Children of a parent that never ends (job id 1 is due: its completion would release them).
WAITING = (
    "INSERT INTO sqla_jobs_job (queue, kind, payload, priority, run_at, state, waiting_on)"
    " SELECT 'default', 'bench', '{}', i % 4, now() - interval '2 hours' + i * interval '1 ms',"
    " 'waiting', 1 FROM generate_series(1, %(n)s) i"
)


def _probe(conn: Conn) -> Figures:
    probe = _new("claimable_queues")
    params = {"queues": ["default"], "keyed": False}
    with conn.transaction(force_rollback=True):
        buffers, ms = _explain(conn, probe, params)
    return buffers, ms, _wall(lambda c: c.execute(probe.sql, probe.params(**params)), conn)


def _measure(conn: Conn) -> list[tuple[str, Figures]]:
    return [
        ("claim limit 10", _claim(conn, _new("claim"), "default", 10)),
        ("claim limit 100", _claim(conn, _new("claim"), "default", 100)),
        ("idle poll's probe (1 queue)", _probe(conn)),
    ]


def run(server_url: str, waiting: int) -> None:
    with (
        fresh_database(server_url, "sqla_jobs") as url,
        psycopg.connect(libpq_conninfo(url), autocommit=True) as conn,
    ):
        version = conn.execute("SHOW server_version").fetchone()
        print(f"PostgreSQL {version[0] if version else '?'}")
        conn.execute(DUE)
        conn.execute("VACUUM ANALYZE sqla_jobs_job")
        before = _measure(conn)
        conn.execute(WAITING.replace("%(n)s", str(int(waiting))))
        conn.execute("VACUUM ANALYZE sqla_jobs_job")
        after = _measure(conn)
        print(f"{'20k due, then + ' + f'{waiting:,} waiting':48} {'buffers':>17} {'exec ms':>17}"
              f" {'wall ms':>17}")  # fmt: skip
        print(f"{'':48} {'before':>8} {'after':>8} {'before':>8} {'after':>8} {'before':>8}"
              f" {'after':>8}")  # fmt: skip
        for (label, b), (_, a) in zip(before, after, strict=True):
            print(
                f"{label:48} {b[0]:>8} {a[0]:>8} {b[1]:>8.2f} {a[1]:>8.2f} {b[2]:>8.2f} {a[2]:>8.2f}"
            )
        claim = _new("claim")
        with conn.transaction(force_rollback=True):
            plan = conn.execute(
                "EXPLAIN (COSTS OFF) " + claim.sql, claim.params(**_claim_params("default", 10))
            ).fetchall()
        print("\nthe claim's plan with the waiting backlog:")
        print("\n".join(str(r[0]) for r in plan))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.waiting_claim", description=__doc__)
    parser.add_argument("--url", help="server URL (default DATABASE_URL, else embedded)")
    parser.add_argument("--waiting", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    if args.url:
        run(args.url, args.waiting)
        return
    with database_url() as url:
        run(url, args.waiting)


if __name__ == "__main__":
    main()
