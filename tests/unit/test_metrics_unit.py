"""The metrics extra without a database: nothing imports prometheus_client unless metrics are on,
and settings that cannot work are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sqla_jobs import ConfigurationError


def test_without_metrics_nothing_imports_prometheus_client() -> None:
    """The package, the worker, the testing helpers and the CLI's parser, in a fresh interpreter."""
    code = (
        "import sys, sqla_jobs, sqla_jobs.worker, sqla_jobs.cli, sqla_jobs.testing\n"
        "sqla_jobs.cli.build_parser().parse_args(['worker', 'app:jobs'])\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_metrics_refuse_a_port_out_of_range_and_an_interval_not_above_zero() -> None:
    from sqla_jobs.observe.metrics import Metrics

    with pytest.raises(ConfigurationError, match="port must be 0 to 65535"):
        Metrics(port=70000)
    with pytest.raises(ConfigurationError, match="sample_interval must be > 0"):
        Metrics(sample_interval=0)


def test_a_worker_asked_for_metrics_without_prometheus_client_exits_2_naming_the_extra() -> None:
    """``--metrics-port`` where prometheus_client cannot be imported: a usage error (exit 2)."""
    code = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None\n"
        "from sqla_jobs.cli import main\n"
        "sys.exit(main(['worker', 'tests.acceptance.app:jobs', '--metrics-port', '0',"
        " '--database-url', 'postgresql://nobody@127.0.0.1:1/x']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "pip install 'sqla-jobs[metrics]'" in done.stderr
