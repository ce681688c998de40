"""Developer and CI entry points. CI (.ci/run) calls exactly these sessions.

nox -s tests       the test suite (DATABASE_URL, else an embedded PostgreSQL)
nox -s lint        ruff check + ruff format --check
nox -s typecheck   mypy --strict on the package, and the typing cases (tests/typing)
nox -s demo        the guided demo (embedded PostgreSQL unless DATABASE_URL is set)
nox -s bench       the benchmark suite (writes bench/results/)
nox -s chaos       the reliability suite at full size; regenerates RELIABILITY.md
nox -s examples    the example application's tests (examples/shop; DATABASE_URL, else embedded)
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

PYTHON = ["3.10", "3.11", "3.12", "3.13"]


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite against a real PostgreSQL."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def examples(session: nox.Session) -> None:
    """The example application (examples/shop): installed as its README says, then its tests, on
    DATABASE_URL's server, else on an embedded PostgreSQL."""
    session.chdir("examples/shop")
    # requirements.txt installs this repository's package (-e ../..) and the shop (-e .).
    session.install("-r", "requirements.txt")
    session.run("pytest", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """The reliability suite at full size; regenerates RELIABILITY.md from its figures."""
    session.install("-e", ".[test]")
    figures = f"{session.create_tmp()}/figures.jsonl"
    session.run("rm", "-f", figures, external=True)
    session.run(
        "pytest",
        "tests/reliability",
        *session.posargs,
        env={"SQLA_JOBS_CHAOS": "full", "SQLA_JOBS_FIGURES": figures},
    )
    with open("RELIABILITY.md", "w") as out:
        session.run("python", "-m", "tests.reliability.report", figures, stdout=out)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff>=0.17,<0.18")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict with the pydantic plugin; then the typing cases, which run mypy on snippets
    that must type-check, or fail with the errors they name (the tests session skips them)."""
    session.install("-e", ".[test]", "mypy>=1.10")
    session.run("mypy")
    session.run("pytest", "tests/typing", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The guided tour: enqueue with a business row, workers, backoff, dead jobs, a rescued crash."""
    session.install("-e", ".[embedded]")
    session.run("sqla-jobs", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against the raw-SQL baseline, in one run; pass --quick for a short smoke run."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "bench", *session.posargs)
