"""The throughput page: the last hour of the workers' per-minute counts (sqla_jobs_throughput),
charted as inline SVG served by the app itself, filterable by queue."""

from __future__ import annotations

import re

from sqlalchemy import Engine, text

from ._dashboard import dashboard


def record(engine: Engine, minutes_ago: int, queue: str, kind: str, **counts: float) -> None:
    """A row as workers write them, ``minutes_ago`` minutes back by the database's clock."""
    names = ", ".join(counts)
    values = ", ".join(f":{c}" for c in counts)
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO sqla_jobs_throughput (minute, queue, kind, {names}) VALUES "
                f"(date_trunc('minute', now()) - :ago * interval '1 minute', :queue, :kind, "
                f"{values})"
            ),
            {"ago": minutes_ago, "queue": queue, "kind": kind, **counts},
        )


def test_throughput_page_charts_runs_by_outcome_and_mean_latency_per_minute(
    clean: Engine,
) -> None:
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_throughput"))
    record(clean, 1, "mail", "send_invoice", completed=8, dead=1, runs=9, run_seconds=4.5,
           pickups=9, pickup_seconds=0.9)  # fmt: skip
    record(clean, 3, "reports", "build_report", completed=2, failed=1, runs=3, run_seconds=30.0,
           pickups=3, pickup_seconds=3.0)  # fmt: skip
    record(clean, 90, "mail", "send_invoice", completed=500)  # before the hour
    with dashboard(clean) as client:
        page = client.get("/throughput").text
        mail = client.get("/throughput?queue=mail").text
        refused = client.get("/throughput?queue=no%20such")
    assert page.count('<svg class="chart"') == 2
    assert "<script" not in page
    bars = re.findall(r'<rect class="s-(\w+)"[^>]*><title>\d\d:\d\d \w+: (\d+)</title>', page)
    assert sorted(bars) == [("completed", "2"), ("completed", "8"), ("dead", "1"), ("failed", "1")]
    assert re.search(r'<circle class="s-run"[^>]*><title>\d\d:\d\d run: 500ms</title>', page)
    assert re.search(r'<circle class="s-pickup"[^>]*><title>\d\d:\d\d pickup: 100ms</title>', page)
    completed = re.search(r'<td>mail</td><td>send_invoice</td>\s*<td class="num">(\d+)</td>', page)
    assert completed, page
    assert completed.group(1) == "8", "the minute before the hour is left out"
    assert "<td>reports</td><td>build_report</td>" in page
    assert "<td>reports</td>" not in mail
    assert '<option value="reports">reports</option>' in mail, "every queue stays selectable"
    assert refused.status_code == 400


def test_throughput_page_says_when_nothing_ran_in_the_hour(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(text("TRUNCATE sqla_jobs_throughput"))
    with dashboard(clean) as client:
        page = client.get("/throughput")
    assert page.status_code == 200
    assert "No run ended in the last hour" in page.text
