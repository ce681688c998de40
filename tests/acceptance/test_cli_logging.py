"""The worker's log output: logfmt or JSON lines for every logger (a handler's own included),
a dictConfig from a file, and one-line errors for a bad level, format or file."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests._waiting import wait_until
from tests.acceptance._processes import WorkerProcess, run_cli
from tests.acceptance.ops_app import jobs
from tests.acceptance.test_cli import assert_one_line_error

Spawn = Callable[..., WorkerProcess]
TARGET = "tests.acceptance.ops_app:jobs"
#: tomllib came with Python 3.11; on 3.10 the worker refuses a TOML log config (tested below).
TOML_READABLE = sys.version_info >= (3, 11)


def enqueue_note(engine: Engine, tag: str) -> int:
    with Session(engine) as session:
        job_id = jobs.enqueue(session, "note", {"tag": tag}).id
        session.commit()
    return job_id


def test_with_log_format_json_the_worker_and_a_handlers_own_logger_write_json_lines(
    ops_effects: Engine, spawn_worker: Spawn
) -> None:
    job_id = enqueue_note(ops_effects, "hello")
    worker = spawn_worker("--log-format", "json", target=TARGET)
    wait_until(lambda: '"logger": "ops_app"' in worker.log, "the handler's line is logged")
    wait_until(lambda: '"event": "completed"' in worker.log, "the completion is logged")
    records = [json.loads(line) for line in worker.log.splitlines() if line.strip()]
    (noted,) = [r for r in records if r["logger"] == "ops_app"]
    assert noted["event"] == "noted"
    assert noted["job_id"] == job_id
    assert noted["msg"] == "noted hello"
    (completed,) = [r for r in records if r.get("event") == "completed"]
    assert completed["job_id"] == job_id
    assert completed["kind"] == "note"
    assert isinstance(completed["duration_ms"], float)
    assert "hello" not in json.dumps(completed), "payloads are never logged"


def test_in_logfmt_a_handlers_own_line_names_its_logger(
    ops_effects: Engine, spawn_worker: Spawn
) -> None:
    enqueue_note(ops_effects, "hi")
    worker = spawn_worker(target=TARGET)
    wait_until(lambda: "logger=ops_app event=noted" in worker.log, "the handler's line")
    wait_until(lambda: "event=completed" in worker.log, "the completion")
    (completed,) = [line for line in worker.log.splitlines() if "event=completed" in line]
    assert " duration_ms=" in completed


@pytest.mark.parametrize(
    "suffix",
    [
        ".json",
        pytest.param(
            ".toml",
            marks=pytest.mark.skipif(not TOML_READABLE, reason="no tomllib before Python 3.11"),
        ),
    ],
)
def test_log_config_applies_a_dict_config_from_a_json_or_toml_file(
    ops_effects: Engine, spawn_worker: Spawn, tmp_path: Path, suffix: str
) -> None:
    config = {
        "version": 1,
        "formatters": {"plain": {"format": "CUSTOM %(name)s %(message)s"}},
        "handlers": {"err": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "root": {"level": "INFO", "handlers": ["err"]},
    }
    path = tmp_path / f"logging{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(config))
    else:
        path.write_text(
            'version = 1\n[formatters.plain]\nformat = "CUSTOM %(name)s %(message)s"\n'
            '[handlers.err]\nclass = "logging.StreamHandler"\nformatter = "plain"\n'
            '[root]\nlevel = "INFO"\nhandlers = ["err"]\n'
        )
    enqueue_note(ops_effects, "configured")
    worker = spawn_worker("--log-config", str(path), target=TARGET)
    wait_until(lambda: "CUSTOM ops_app noted configured" in worker.log, "the handler's line")
    wait_until(lambda: "CUSTOM sqla_jobs.worker" in worker.log, "the worker's own lines")


@pytest.mark.skipif(TOML_READABLE, reason="Python 3.11 and later read TOML (the test above)")
def test_on_python_3_10_a_toml_log_config_exits_2_asking_for_json(
    migrated_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "logging.toml"
    path.write_text("version = 1\n")
    result = run_cli("worker", TARGET, "--log-config", str(path), database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "TOML needs Python 3.11 or later; use JSON")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--log-level", "LOUD"], "invalid log level 'LOUD'"),
        (["--log-format", "xml"], "invalid log format 'xml'"),
        (["--log-config", "/nonexistent/logging.json"], "cannot read log config"),
    ],
    ids=["level", "format", "missing-file"],
)
def test_a_bad_logging_option_exits_2_with_a_one_line_error(
    migrated_url: str, args: list[str], fragment: str
) -> None:
    result = run_cli("worker", TARGET, *args, database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, fragment)


def test_a_log_config_that_is_not_a_dict_config_exits_2(migrated_url: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = run_cli("worker", TARGET, "--log-config", str(broken), database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "is not valid JSON")
    no_version = tmp_path / "no_version.json"
    no_version.write_text('{"root": {}}')
    result = run_cli("worker", TARGET, "--log-config", str(no_version), database_url=migrated_url)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "not a logging.config.dictConfig")
