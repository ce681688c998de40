"""Render RELIABILITY.md from the figures the chaos run wrote (``SQLA_JOBS_FIGURES``).

python -m tests.reliability.report FIGURES.jsonl > RELIABILITY.md
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

HEADER = """# Reliability

Every row is an automated test that injects a real fault into real worker processes and a real
PostgreSQL, in `tests/reliability/`. The default test command runs each scenario scaled down;
`nox -s chaos` runs them at full size and regenerates this file from the figures they record.
"""


#: Scenarios proven by tests outside this suite (they run in the default test command, with
#: pass/fail as their figure).
ELSEWHERE = """
Also injected, by tests in the default test command (their figure is pass or fail):

| scenario | injects | test |
| --- | --- | --- |
| SIGTERM drain: in-flight jobs finish, nothing left running, exit 0 | SIGTERM to a worker process with 4 jobs of 2 s in flight | `tests/acceptance/test_worker_process.py::test_sigterm_lets_jobs_in_flight_finish_and_exits_0` |
| A second signal exits at once with 130; the abandoned lease is reaped later | two SIGTERMs during a 120 s job | `tests/acceptance/test_worker_process.py::test_a_second_sigterm_exits_at_once_with_130` |
| Lease loss: the stale worker's completion is refused by the lease fence | heartbeats frozen by a test hook (`worker.leases.frozen`), another worker re-claims | `tests/integration/test_worker.py::test_a_worker_that_lost_its_lease_cannot_complete_the_job_another_worker_reclaimed` |
| SIGKILL mid-job: reaped after the lease, completed by another worker, counted as a crash | SIGKILL of the worker process running the job | `tests/acceptance/test_worker_process.py::test_a_job_whose_worker_is_sigkilled_is_reaped_and_completed_by_another_worker` |
| Durable steps survive SIGKILL: steps 1-2 not re-run, step 3 runs | the handler SIGKILLs its own process after step two | `tests/acceptance/test_steps_kill.py::test_sigkill_after_step_two_reruns_only_step_three` |
"""


def render(lines: list[dict[str, object]]) -> str:
    out = [HEADER]
    if lines:
        first = lines[0]
        out.append(
            f"Figures from the run of {first['at']} ({first['scale']} scale) on "
            f"{platform.system()} {platform.machine()}, Python {platform.python_version()}.\n"
        )
    out.append("| scenario | injects | figures | reproduce |")
    out.append("| --- | --- | --- | --- |")
    for line in lines:
        figs = line["figures"]
        assert isinstance(figs, dict)
        shown = ", ".join(f"{k}={v}" for k, v in figs.items())
        out.append(f"| {line['scenario']} | {line['injects']} | {shown} | `{line['command']}` |")
    out.append(ELSEWHERE)
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else None
    if path is None or not path.exists():
        print("usage: python -m tests.reliability.report FIGURES.jsonl", file=sys.stderr)
        return 2
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    # Latest figures per test win.
    latest = {line["node"]: line for line in lines}
    sys.stdout.write(render(sorted(latest.values(), key=lambda x: x["node"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
