"""Developer and CI entry points. CI (.ci/run) calls exactly these sessions.

nox -s tests       the test suite on this interpreter at the newest dependencies (DATABASE_URL,
                   else an embedded PostgreSQL); --force-python 3.12 runs it on another one.
                   In parallel processes (pytest-xdist, each with its own database; with no
                   DATABASE_URL each starts its own embedded server); `-- -n 0` runs it in one
nox -s quick       the edit-test loop: unit and integration tests, in parallel
nox -s tests_lowest  the suite on the oldest declared Python (3.10) at the lowest release of
                   every direct dependency that pyproject.toml allows (uv --resolution lowest-direct)
nox -s lint        ruff check + ruff format --check
nox -s typecheck   mypy --strict on the package, and the typing cases (tests/typing)
nox -s demo        the guided demo, python -m demo (embedded PostgreSQL unless DATABASE_URL is set)
nox -s bench       the benchmark suite (writes bench/results/)
nox -s chaos       the reliability suite at full size, serial; regenerates RELIABILITY.md
nox -s examples    the example application's tests (examples/shop; DATABASE_URL, else embedded)
nox -s docs        the documentation site, built strictly into docs/_build/html
nox -s browser     the dashboard in a real browser (Debian's chromium and chromium-driver);
                   SQLA_JOBS_SCREENSHOTS=1 also rewrites the screenshots in docs/

CI covers every declared Python, one suite at a time, each in parallel processes (the tests
session's -n), on the machine's PostgreSQL 15 or an embedded PostgreSQL 18: the whole suite on
three of them, and on the fourth the unit and integration tests (the library's own code; its
processes, migrations and fault scenarios already run on three Pythons and both servers):

    tests --force-python 3.11   (newest dependencies)   machine's PostgreSQL 15
    tests --force-python 3.13   (newest dependencies)   embedded PostgreSQL 18
    tests_lowest                (3.10, the floors)      machine's PostgreSQL 15
    quick --force-python 3.12   (newest dependencies)   embedded PostgreSQL 18

then examples, browser, lint, typecheck and docs, one at a time.
"""

from __future__ import annotations

import signal
from types import FrameType

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


# nox stops the session's command on a Ctrl-C but dies on a SIGTERM, leaving pytest (and its
# embedded PostgreSQL) running: a SIGTERM is made a Ctrl-C.
signal.signal(signal.SIGTERM, _interrupt)

#: Every Python that requires-python admits. CI runs the whole suite on three: tests on 3.11 and
#: 3.13 (--force-python), tests_lowest on the oldest; and quick on 3.12.
PYTHON = ["3.10", "3.11", "3.12", "3.13"]
#: The extras whose floors tests_lowest checks with the test suite's own.
LOWEST_EXTRAS = "test,metrics,otel,embedded"
#: pytest-xdist's processes. The tests wait on real time (leases, polls, killed processes) far more
#: than they compute, so more processes than cores pay. Posargs come after, so `-- -n 0` wins.
#: loadgroup: tests share the load, except those marked xdist_group(name), which run in one process.
PARALLEL = ("-n", "6", "--dist", "loadgroup")
#: The quick session: no worker processes of their own, no browser, no packaging builds.
QUICK = ("tests/unit", "tests/integration")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite against a real PostgreSQL, at the newest dependencies."""
    session.install("-e", ".[test]")
    session.run("pytest", *PARALLEL, *session.posargs)


@nox.session
def quick(session: nox.Session) -> None:
    """The edit-test loop: the unit and integration tests, in parallel (DATABASE_URL, else an
    embedded PostgreSQL). The acceptance, migration, reliability and packaging tests are left to
    nox -s tests."""
    session.install("-e", ".[test]")
    session.run("pytest", *PARALLEL, *QUICK, *session.posargs)


@nox.session(python=PYTHON[0])
def tests_lowest(session: nox.Session) -> None:
    """Run the test suite at the floors: every direct dependency (the package's, its extras' and
    the tests') at the lowest release pyproject.toml allows, on the oldest declared Python; their
    own dependencies at the newest that fit. A floor that is too low fails here, not for a user."""
    # pip has no lowest resolution; uv, installed into the session, fills the session's venv.
    session.install("uv>=0.4")
    session.run(
        "uv",
        "pip",
        "install",
        "--python",
        f"{session.bin}/python",
        "--resolution",
        "lowest-direct",
        "-e",
        f".[{LOWEST_EXTRAS}]",
    )
    session.run("python", "-m", "pip", "list", "--format=freeze")
    session.run("pytest", *PARALLEL, *session.posargs)


@nox.session
def examples(session: nox.Session) -> None:
    """The example application (examples/shop): installed as its README says, then its tests, on
    DATABASE_URL's server, else on an embedded PostgreSQL."""
    session.chdir("examples/shop")
    # requirements.txt installs this repository's package (-e ../..) and the shop (-e .).
    session.install("-r", "requirements.txt")
    session.run("pytest", *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    """The dashboard in headless Chromium, driven by Selenium: list queues, retry a dead job,
    pause and resume a queue, cancel a running job, be refused without credentials. Needs
    /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver)."""
    session.install("-e", ".[test,dashboard,browser]")
    session.run("pytest", "tests/browser", *session.posargs, env={"SQLA_JOBS_BROWSER": "1"})


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (docs/README.md), into docs/_build/html. Strict: a broken
    cross-reference, a link to a page, heading or repository file that does not exist, or a
    public name missing from the API reference fails it. Needs Python 3.11+ (Sphinx 9)."""
    # pytest: the reference documents the pytest plugin's fixtures, which import it.
    session.install("-r", "docs/requirements.txt", "-e", ".[metrics,otel,dashboard]", "pytest>=8")
    session.run(
        "sphinx-build",
        *("-E", "-n", "-W", "--keep-going", "-q", "-b", "html"),
        "docs",
        "docs/_build/html",
        *session.posargs,
    )


@nox.session
def chaos(session: nox.Session) -> None:
    """The reliability suite at full size; regenerates RELIABILITY.md from its figures. Serial
    (no -n): its figures are published, and parallel neighbours' load would skew them."""
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
    """The guided tour: enqueue with a business row, workers, backoff, dead jobs, a rescued crash.

    The demo is an application in this repository (demo/), not part of the package."""
    session.install("-e", ".[embedded]")
    session.run("python", "-m", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against the raw-SQL baseline, in one run; pass --quick for a short smoke run."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "bench", *session.posargs)
