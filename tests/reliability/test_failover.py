"""Failover: a private primary and streaming standby (``_standby``), two real worker processes and a
steady enqueue on one multi-host URL (``target_session_attrs=read-write``); the primary fails in
each of the ways production sees, the standby is promoted, and the tally is read from it.

Every handler writes its effect through the handler Session (``failover_app``), so a token with two
effect rows took effect twice. An enqueue whose commit never answered is "unknown", counted apart.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from sqla_jobs.db.urls import sqlalchemy_url
from tests.reliability._standby import Node, Pair
from tests.reliability.chaos_app import Fleet
from tests.reliability.conftest import Figures, injects, scaled
from tests.reliability.failover_app import TARGET, Effect, jobs
from tests.reliability.failover_run import (
    LEASE,
    OPTIONS,
    FailoverRun,
    beaten_after,
    last_token,
    throughput_mark,
    throughput_runs,
    wait_for,
    workers_alive,
)

#: Effects before the fault, and on the new primary after it.
PRE = scaled(40, 400)
POST = scaled(40, 400)
#: How long the frozen primary stays frozen after the promotion before it is killed.
FROZEN_S = scaled(4, 20)
#: How long a worker on a standby-only URL is watched before the standby is promoted.
STANDBY_ONLY_S = scaled(6, 130)
#: Enqueues the primary acknowledges once its asynchronous standby is cut off, before it dies.
LAG = scaled(15, 50)

#: Per worker and outage: the line that it started, the line that it ended, and room for one more
#: (psycopg's own warning about a pipeline it could not close). Each job the outage touched has a
#: line of its own, counted apart: a run it cut off (``event=run_lost``, at most the concurrency),
#: a lease the new primary never had (``event=lease_lost``: asynchronous replication lost the claim),
#: a job whose end the new primary never got, given back by its worker (``event=orphan_given_back``)
#: or, were that missed, reaped (``event=reaped``).
OUTAGE_LINES = 3
PER_JOB = ("event=run_lost ", "event=lease_lost ", "event=reaped ", "event=orphan_given_back ")


def outage_lines(lines: list[str]) -> list[str]:
    """The lines a worker logged about the outage: above INFO, but a job's own lines."""
    return [
        x
        for x in lines
        if not re.search(r"level=(info|debug)\b", x, re.IGNORECASE)
        and not any(e in x for e in PER_JOB)
    ]


def counts(run: FailoverRun) -> dict[str, list[int]]:
    """Per worker, since the fault: all lines, the outage's lines, and runs the outage cut off."""
    per_worker = run.lines()
    return {
        "lines": [len(x) for x in per_worker],
        "outage_lines": [len(outage_lines(x)) for x in per_worker],
        "runs_lost": [sum("event=run_lost " in line for line in x) for x in per_worker],
        "given_back": [sum("event=orphan_given_back " in line for line in x) for x in per_worker],
    }


def one_line_per_outage(o: Outcome) -> None:
    assert all(n <= OUTAGE_LINES for n in o.counts["outage_lines"]), (
        o.counts,
        [outage_lines(x) for x in o.lines],
    )


def no_thread_died(run: FailoverRun) -> None:
    logs = run.logs()
    assert "Exception in thread" not in logs, logs


@dataclass
class Outcome:
    """A failover run's tally (``FailoverRun.finish``), its log counts, and the seconds from the
    promotion to the first job run on the new primary."""

    tally: dict[str, Any]
    counts: dict[str, list[int]]
    first: float
    lines: list[list[str]]


def fail_over(
    ha_pair: Pair,
    run: FailoverRun,
    fault: Callable[[], float],
    *,
    before: int = PRE,
    after: int = POST,
    then: Callable[[float], None] = lambda promoted_at: None,
) -> Outcome:
    """Run ``fault`` (it breaks the primary and promotes the standby, returning the promotion's
    time) once ``before`` effects are in, wait for ``after`` effects on the new primary and for
    ``then``, and check that the workers go on there by themselves: each worker's registry row
    beaten and its throughput recorded on the new primary, every worker alive (none needed a
    restart), no thread died."""
    new = ha_pair.standby
    try:
        run.wait_effects(ha_pair.primary, before)
        run.mark()
        promoted_at = fault()
        counted = throughput_mark(new)
        first = run.first_run_after(new, promoted_at)
        run.wait_effects(new, after, since=promoted_at)
        # At least one run after the count was read, before the enqueue stops: on a loaded
        # machine every run since the promotion could be in before it.
        run.wait_effects(new, 1, since=counted[1])
        then(promoted_at)
        registry_beaten(new, run, promoted_at)
        alive = workers_alive(run)
        tally = run.finish(new)
        throughput_recorded(new, run, counted)
        no_thread_died(run)
    finally:
        run.close()
    assert alive, "a worker exited: it needed a restart"
    return Outcome(tally, counts(run), first, run.lines())


def registry_beaten(new: Node, run: FailoverRun, promoted_at: float) -> None:
    """Every worker's registry row is beaten on the new primary after the promotion: the thread
    that beats it met the failover and went on."""
    no_thread_died(run)
    pids = {w.pid for w in run.fleet.workers}
    wait_for(
        "every worker's registry row beaten on the new primary",
        lambda: beaten_after(new, run, promoted_at) == pids, 30, run.logs,
    )  # fmt: skip


def throughput_recorded(new: Node, run: FailoverRun, counted: tuple[int, float]) -> None:
    """Once the queue is drained, the new primary's throughput counts every run it saw commit
    since ``counted`` (:func:`throughput_mark`, read after the promotion). The table has no worker
    column; the check still fails if either worker's writer stopped, since no other worker counts
    its runs and, the enqueue stopped, no later run can make up for them."""
    runs, since = counted
    ran = run.effects(new, since=since)
    assert ran > 0, "no run on the new primary after its throughput was read"
    wait_for(
        f"the {ran} runs on the new primary counted in its throughput",
        lambda: throughput_runs(new) - runs >= ran, 30, run.logs,
    )  # fmt: skip


@injects("sync replication; primary stopped -m immediate under load, standby promoted at once")
def test_unplanned_failover_with_sync_replication_loses_and_repeats_nothing(
    ha_pair: Pair, figures: Figures, tmp_path: Path
) -> None:
    """Unplanned failover, synchronous standby: every acknowledged job takes effect exactly once,
    the workers go on by themselves, no job is charged, one line per outage"""
    ha_pair.make_sync()

    def fault() -> float:
        ha_pair.primary.stop("immediate")
        return ha_pair.standby.promote()

    o = fail_over(ha_pair, FailoverRun(ha_pair, tmp_path).start(), fault)
    t = o.tally
    assert (t["lost"], t["duplicated"], t["dead"]) == ([], [], []), t
    figures.record(
        acked=t["acked"], lost=0, duplicated=0, unknown=t["unknown"],
        unknown_took_effect=t["unknown_took_effect"], first_run_after_promotion_s=o.first,
        crashed=t["crashed"], charged=t["charged"], **o.counts,
    )  # fmt: skip
    assert (t["charged"], t["crashed"]) == (0, 0), f"jobs charged for the failover: {t}"
    one_line_per_outage(o)


@injects(
    "sync replication; primary turned read-only (default_transaction_read_only reloaded), then "
    "stopped cleanly (AdminShutdown), standby promoted"
)
def test_planned_switchover_kills_no_thread_and_charges_no_job(
    ha_pair: Pair, figures: Figures, tmp_path: Path
) -> None:
    """Planned switchover (read-only, clean stop, promote): no thread dies, the registry and
    throughput go on on the new primary, no job is charged, one line per outage"""
    ha_pair.make_sync()
    run = FailoverRun(ha_pair, tmp_path).start()

    def fault() -> float:
        ha_pair.primary.read_only()
        # Read-only long enough for every worker thread to meet it (a reap and a registry beat).
        refused = len(run.enqueuer.refused)
        wait_for(
            "enqueues refused", lambda: len(run.enqueuer.refused) >= refused + 20, 60, run.logs
        )
        time.sleep(LEASE)  # the read-only phase of a switchover lasts; every thread writes in it
        ha_pair.primary.stop("fast")
        return ha_pair.standby.promote()

    o = fail_over(ha_pair, run, fault)
    t = o.tally
    assert (t["lost"], t["duplicated"], t["dead"]) == ([], [], []), t
    assert (t["charged"], t["crashed"]) == (0, 0), f"jobs charged for the failover: {t}"
    one_line_per_outage(o)
    figures.record(
        acked=t["acked"], lost=0, duplicated=0, unknown=t["unknown"], refused=t["refused"],
        first_run_after_promotion_s=o.first, charged=0, crashed=0, **o.counts,
    )  # fmt: skip


@injects(
    f"async replication; the standby cut off from the primary, {LAG} more enqueues acknowledged by "
    "the primary alone, primary stopped -m immediate, standby promoted"
)
def test_async_replication_counts_what_it_loses(
    ha_pair: Pair, figures: Figures, tmp_path: Path
) -> None:
    """Asynchronous standby: acknowledged jobs the standby never got are counted as lost, commits
    that never answered as unknown; nothing takes effect twice"""
    run = FailoverRun(ha_pair, tmp_path).start()
    #: Tokens enqueued once the walsender was gone, and acknowledged by the old primary at all.
    after_cut: list[int] = []
    acked_old: list[int] = []
    standby_had = 0
    in_flight: set[int] = set()

    def fault() -> float:
        nonlocal after_cut, acked_old, standby_had, in_flight
        # A local standby never lags: cut it off, so that commits made from now on are on the
        # primary alone when it dies.
        ha_pair.cut_replication()
        # The enqueuer's one thread makes tokens in order. The one in flight now (count + 1) may
        # have committed, and been streamed, before the cut, though acknowledged after it: only
        # the tokens after it started once the walsender was gone.
        first_after = run.enqueuer.count + 2
        wait_for(
            f"{LAG} enqueues made and acknowledged by the primary alone",
            lambda: sum(x >= first_after for x in list(run.enqueuer.acked)) >= LAG, 60, run.logs,
        )  # fmt: skip
        ha_pair.primary.stop("immediate")
        # Only the old primary acknowledged these: the standby is not promoted yet.
        acked_old = list(run.enqueuer.acked)
        after_cut = [x for x in acked_old if x >= first_after]
        promoted_at = ha_pair.standby.promote()
        standby_had = last_token(ha_pair.standby, max(acked_old))
        # Claims the standby got before the cut (their leases end before any claim's on it).
        in_flight = {
            int(x)
            for (x,) in ha_pair.standby.rows(
                "SELECT (payload->>'token')::bigint FROM sqla_jobs_job WHERE state = 'running'"
                " AND lease_expires_at < to_timestamp(%s) + make_interval(secs => %s)",
                (promoted_at, LEASE),
            )
        }
        return promoted_at

    o = fail_over(ha_pair, run, fault)
    t = o.tally
    assert t["duplicated"] == [], t
    # Lost: exactly the acknowledged tail the standby never received; at least what was
    # enqueued once it was cut off.
    assert t["lost"] == [x for x in acked_old if x > standby_had], (standby_had, t)
    assert set(after_cut) <= set(t["lost"]), (after_cut, t)
    assert len(t["lost"]) >= LAG, t
    figures.record(
        acked=t["acked"], lost=len(t["lost"]), acked_after_cut=len(after_cut), duplicated=0,
        unknown=t["unknown"], unknown_took_effect=t["unknown_took_effect"], dead=len(t["dead"]),
        first_run_after_promotion_s=o.first, charged=t["charged"], crashed=t["crashed"],
        in_flight_at_cut=len(in_flight), **o.counts,
    )  # fmt: skip
    assert t["dead"] == [], t
    # A job claimed before the cut and completed on the old primary after it is running on the
    # new primary under a lease its worker dropped: the worker, back, gives it back uncharged
    # (sqla_jobs.worker.orphans) before the reaper would charge it a crash.
    assert (t["charged"], t["crashed"]) == (0, 0), (
        f"jobs charged for the failover: {(in_flight, t)}"
    )
    one_line_per_outage(o)


@injects(
    f"sync replication; primary frozen (SIGSTOP of all its processes), standby promoted, old "
    f"primary killed {FROZEN_S} s later"
)
def test_frozen_primary_then_killed(ha_pair: Pair, figures: Figures, tmp_path: Path) -> None:
    """Frozen primary: connections hang rather than fail; work moves to the promoted standby once
    the threads notice (keepalives cannot: the frozen server's kernel still answers them)"""
    ha_pair.make_sync()
    run = FailoverRun(ha_pair, tmp_path).start()
    while_frozen = 0
    killed_after = 0.0

    def fault() -> float:
        nonlocal while_frozen, killed_after
        ha_pair.primary.freeze()
        promoted_at = ha_pair.standby.promote()
        time.sleep(FROZEN_S)  # the length of the fault: how long the old primary hangs
        while_frozen = run.effects(ha_pair.standby, since=promoted_at)
        killed_at = float(ha_pair.standby.sql("SELECT extract(epoch FROM clock_timestamp())"))
        killed_after = killed_at - promoted_at
        ha_pair.primary.kill()
        return promoted_at

    o = fail_over(ha_pair, run, fault)
    t = o.tally
    assert (t["lost"], t["duplicated"], t["dead"]) == ([], [], []), t
    figures.record(
        acked=t["acked"], lost=0, duplicated=0, unknown=t["unknown"], frozen_s=FROZEN_S,
        runs_while_frozen=while_frozen, first_run_after_promotion_s=o.first,
        first_run_after_kill_s=round(max(o.first - killed_after, 0), 2),
        charged=t["charged"], crashed=t["crashed"], **o.counts,
    )  # fmt: skip
    assert (t["charged"], t["crashed"]) == (0, 0), f"jobs charged for the failover: {t}"
    one_line_per_outage(o)


@injects(f"a worker whose URL names only a standby, watched {STANDBY_ONLY_S} s, then promoted")
def test_a_worker_on_a_standby_only_waits_and_says_why(
    ha_pair: Pair, figures: Figures, tmp_path: Path
) -> None:
    """A worker whose URL names only a standby waits, says why in one line (then at most one a
    minute), and starts working when the standby is promoted"""
    url = Pair.hosts_url(ha_pair.standby)
    fleet = Fleet(url, tmp_path, OPTIONS, target=TARGET, die_with_parent=True)
    try:
        worker = fleet.spawn()

        def said() -> list[str]:
            return outage_lines(worker.log.splitlines())

        wait_for("a line about the standby", lambda: said() != [], 60, fleet.logs)
        # How long the worker is left on a standby (unless it gives up before).
        watch_until = time.monotonic() + STANDBY_ONLY_S
        while time.monotonic() < watch_until and worker.proc.poll() is None:
            time.sleep(0.1)
        alive = worker.proc.poll() is None
        lines = said()
        if alive:
            promoted_at = ha_pair.standby.promote()
            eng = create_engine(sqlalchemy_url(ha_pair.standby.url()))
            with Session(eng) as session:
                jobs.enqueue(session, Effect(token=1))
                session.commit()
            eng.dispose()
            wait_for(
                "the job run on the promoted standby",
                lambda: int(ha_pair.standby.sql("SELECT count(*) FROM fo_effects")) == 1,
                60, fleet.logs,
            )  # fmt: skip
            started_s = round(time.time() - promoted_at, 2)
    finally:
        fleet.close()
    assert alive, f"the worker exited instead of waiting:\n{fleet.logs()}"
    allowed = 1 + int(STANDBY_ONLY_S // 60)
    assert len(lines) <= allowed, "\n".join(lines)
    assert re.search(r"standby|recovery|read-only|read-write", lines[0], re.IGNORECASE), lines
    figures.record(watched_s=STANDBY_ONLY_S, lines=len(lines), job_run_after_promotion_s=started_s)


def test_a_worker_waiting_for_a_primary_stops_at_once_on_sigterm(
    ha_pair: Pair, tmp_path: Path
) -> None:
    """A worker that waits on a standby-only URL exits 0 at once on SIGTERM, saying it never
    started"""
    fleet = Fleet(
        Pair.hosts_url(ha_pair.standby), tmp_path, OPTIONS, target=TARGET, die_with_parent=True
    )
    try:
        worker = fleet.spawn()
        wait_for("the line about the standby", lambda: "event=no_primary " in worker.log, 60,
                 fleet.logs)  # fmt: skip
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.proc.wait(15)
    finally:
        fleet.close()
    assert code == 0, fleet.logs()
    assert "event=stopped " in worker.log
    assert "stopped before it started" in worker.log
    assert "Traceback" not in worker.log, worker.log


@injects(
    f"sync replication; primary stopped -m immediate, standby promoted {2 * LEASE:.0f} s later "
    f"(twice the {LEASE:.0f} s lease), jobs of 300 ms in flight"
)
def test_leases_and_the_reaper_across_a_failover_longer_than_the_lease(
    ha_pair: Pair, figures: Figures, tmp_path: Path
) -> None:
    """A failover longer than the lease: the runs it cut off are rescued on the new primary, each
    job takes effect once, none goes dead or is charged for it"""
    ha_pair.make_sync()

    def fault() -> float:
        ha_pair.primary.stop("immediate")
        time.sleep(2 * LEASE)  # the length of the outage: longer than the lease
        return ha_pair.standby.promote()

    run = FailoverRun(ha_pair, tmp_path, rate=20.0, ms=300).start()
    o = fail_over(ha_pair, run, fault, before=scaled(10, 100), after=scaled(10, 100))
    t = o.tally
    assert (t["lost"], t["duplicated"], t["dead"]) == ([], [], []), t
    figures.record(
        acked=t["acked"], lost=0, duplicated=0, unknown=t["unknown"], outage_s=2 * LEASE,
        first_run_after_promotion_s=o.first, crashed=t["crashed"], charged=t["charged"],
        **o.counts,
    )  # fmt: skip
    assert (t["charged"], t["crashed"]) == (0, 0), f"jobs charged for the failover: {t}"
    one_line_per_outage(o)
