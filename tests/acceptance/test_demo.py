"""The repository's demo (``python -m demo``, ``nox -s demo``) tells the design's story on a real
server and cleans up. How long it takes is the host's speed, not asserted here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

from sqla_jobs.db.urls import libpq_conninfo

REPO = Path(__file__).resolve().parents[2]


def _search(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text, re.MULTILINE)
    assert match is not None, f"no line matching {pattern!r} in the demo's output:\n{text}"
    return match


def test_demo_runs_every_step_on_its_own_database_and_drops_it(server_url: str) -> None:
    """Every step, with the queue in a schema of its own: the tables exist only there, so a read
    of the demo's that ignored ``Jobs(schema=...)`` would fail the run."""
    env = {**os.environ, "DATABASE_URL": server_url}
    proc = subprocess.run(
        [sys.executable, "-m", "demo", "--schema", "demo_queue"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr

    # 2: the shipped migrations, in the schema asked for.
    _search(r"created schema demo_queue for the queue: Jobs\(schema='demo_queue'\)$", out)
    _search(r"migrated to: sqla_jobs_\d+ \(head\)$", out)
    _search(r"^ *index sqla_jobs_job_claim_idx \(.*\) WHERE .*pending", out)
    # 3: the business row and its jobs commit together; a rollback leaves neither.
    _search(r"inside the transaction: .* another connection sees 0 jobs$", out)
    _search(r"^ *committed: another connection now sees 20 pending jobs", out)
    _search(r"rolled back -> 0 invoice, 0 job left$", out)
    # The default wakeup (after_commit) is the library's NOTIFY after the commit, not Postgres's.
    said = " ".join(out.split())
    assert "NOTIFY is sent just after the commit, by the library's notifier" in said, out
    assert "sent by Postgres only at commit" not in said
    # 4: one claim fills the 4 slots, and nobody waits on a lock.
    # (A finished job's row may stay 'running' a few ms after its slot took the next job.)
    # Only claims waiting on a row count: SKIP LOCKED spares them. An outcome write may wait a
    # moment for the heartbeat's renewal of its row, and "extend" is a table growing.
    _search(r"db: [4-8] jobs running at once, 0 claims waiting on a row lock$", out)
    _search(
        r"at most [4-8] jobs running at once; samples with a claim waiting on a row lock: 0$", out
    )
    _search(r"worker-A stopped gracefully: claimed 25, done 19, failed 5, dead 1$", out)
    # 5: retries pushed by the database (the delay read from the worker's record), then done;
    # the broken kind dead with its error.
    _search(r"worker-A: job \d+ \(flaky_webhook\) failed attempt 1, retry at ", out)
    _search(r"-> back to pending, due again in 1\.\d\ds \(run_at set by the database\)$", out)
    _search(r"-> 200 OK on attempt 3$", out)
    _search(r"-> DEAD: its failure budget is spent", out)
    _search(r"^ *send_invoice +done +16 +16 *$", out)
    _search(r"^ *flaky_webhook +done +3 +7 *$", out)
    _search(r"^ *broken_report +dead +1 +2 +FileNotFoundError: report template", out)
    # 6: the frozen worker's job is reaped, rerun elsewhere, and its late write fenced out.
    _search(
        r"worker-C \(reaper\): reaped job \d+ \(nightly_export\) from worker worker-B: crash 1, "
        r"now pending$",
        out,
    )
    _search(r"is still running on worker-C: worker-B's DELETE was fenced", out)
    _search(r"done once, by worker-C, with attempts=2 and crashes=1$", out)
    # 7: the final stats: nothing pending or running, the dead job visible.
    _search(r"^ *default +0 +0 +1 +- *$", out)
    # 8: the benchmark's measurement. Claim rates share two CPUs with everything else, so what is
    # asserted is the steady difference: without SKIP LOCKED the connections wait on locks.
    _search(r"^ *FOR UPDATE +SKIP LOCKED *$", out)
    _search(r"^ *claims per second +[\d,]+ +[\d,]+ *$", out)
    _search(r"^ *connections waiting on a lock +\d+\.\d of 4 +\d+\.\d of 4 *$", out)
    waited = _search(r"^ *time waiting on locks, total +(\d+\.\d\d) s +(\d+\.\d\d) s *$", out)
    assert float(waited[1]) > float(waited[2]), waited[0]

    name = _search(r"created the throw-away database (sqla_jobs_demo_[0-9a-f]+);", out)[1]
    _search(rf"^dropped the demo database {name}$", out)
    with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s", (name,)
        ).fetchall()
    assert left == [], f"the demo left its database {name} behind"
