"""The dashboard's queues page lists the rate limiters: kind and key, limit, starts in the window
now (marked when at the limit), and when the next start is allowed."""

from __future__ import annotations

import re

from sqlalchemy import Engine, text

from ._dashboard import dashboard, make_jobs


def test_the_queues_page_lists_each_limiter_its_use_and_its_next_start(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_rate_limiter"))
        conn.execute(
            text(
                "INSERT INTO sqla_jobs_rate_limiter (rate_key, starts, allowed, per) VALUES"
                " ('export c7', ARRAY[now() - interval '10 seconds'], 1, interval '1 minute'),"
                " ('call_partner', ARRAY[now() - interval '5 seconds'], 10, interval '1 second')"
            )
        )
    try:
        with dashboard(clean, jobs=make_jobs()) as client:
            page = client.get("/")
    finally:
        with clean.begin() as conn:
            conn.execute(text("DELETE FROM sqla_jobs_rate_limiter"))
    assert page.status_code == 200
    section = page.text.split("<h2>Rate limits</h2>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>\s*<th scope=\"row\">.*?</tr>", section, re.S)
    cells = [re.findall(r"<t[hd][^>]*>(?:<a [^>]*>)?([^<]*)", row) for row in rows]
    assert cells[0][:4] == ["call_partner", "-", "10 per 1s", "0"]
    assert cells[0][4] == "now"
    assert cells[1][:4] == ["export", "c7", "1 per 60s", "1"]
    assert re.fullmatch(r"in (4\d|50)\.\ds", cells[1][4]), cells[1]
    assert 'class="num alert">1<' in rows[1], "a limiter at its limit is marked"


def test_the_queues_page_has_no_rate_limits_section_without_limiters(clean: Engine) -> None:
    with clean.begin() as conn:
        conn.execute(text("DELETE FROM sqla_jobs_rate_limiter"))
    with dashboard(clean, jobs=make_jobs()) as client:
        page = client.get("/")
    assert page.status_code == 200
    assert "<h2>Rate limits</h2>" not in page.text
