"""Revision sqla_jobs_0010 (job results): a nullable ``result`` jsonb on ``sqla_jobs_outcome``,
which its downgrade drops (outcomes kept), and up again."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from tests.conftest import alembic_config
from tests.migrations._catalog import connect

_COLUMNS = """
    SELECT column_name, data_type, is_nullable FROM information_schema.columns
     WHERE table_schema = 'public' AND table_name = 'sqla_jobs_outcome' ORDER BY column_name"""


def _columns(url: str) -> list[tuple[str, str, str]]:
    with connect(url) as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(text(_COLUMNS))]


def test_0010_adds_a_nullable_result_and_its_downgrade_drops_only_it(scratch_url: str) -> None:
    cfg = alembic_config(scratch_url)
    command.upgrade(cfg, "sqla_jobs_0009")
    before = _columns(scratch_url)
    with connect(scratch_url) as conn:
        conn.execute(text("INSERT INTO sqla_jobs_outcome (id, outcome) VALUES (1, 'completed')"))
    command.upgrade(cfg, "sqla_jobs_0010")
    assert sorted(set(_columns(scratch_url)) - set(before)) == [("result", "jsonb", "YES")]
    with connect(scratch_url) as conn:
        conn.execute(text("""UPDATE sqla_jobs_outcome SET result = '{"a": 1}' WHERE id = 1"""))
    command.downgrade(cfg, "sqla_jobs_0009")
    assert _columns(scratch_url) == before
    with connect(scratch_url) as conn:
        assert conn.execute(text("SELECT outcome FROM sqla_jobs_outcome")).scalars().all() == [
            "completed"
        ]
    command.upgrade(cfg, "sqla_jobs_0010")
    assert ("result", "jsonb", "YES") in _columns(scratch_url)
