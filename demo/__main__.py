"""``python -m demo [--database-url URL] [--schema NAME]``: run the guided demo (``nox -s demo``).

Exit codes: 0 when every step behaved as designed, 1 on an error, 2 when the server will not let
the demo create its database, 3 when it cannot be reached, 130 on Ctrl-C. Whatever the exit, the
demo's database, its workers and an embedded server are gone by then.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback

from .closing import contention, stats
from .console import Console
from .database import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ServerUnusable,
    create_database,
    server,
    sigint_deferred,
)
from .rescue import rescue
from .steps import enqueue, migrate, outcomes, work
from .tour import Demo


def run(demo: Demo) -> None:
    """Steps 2 to 8 on the demo's database, in order."""
    migrate(demo)
    enqueue(demo)
    demo.attach_log()
    work(demo)
    outcomes(demo)
    rescue(demo)
    demo.detach_log()
    stats(demo)
    contention(demo)


def main(database_url: str | None = None, schema: str | None = None) -> int:
    """Run the guided demo; return the exit code (0: every step behaved as designed).

    The database server is ``database_url``, else ``DATABASE_URL``, else an embedded PostgreSQL
    started for the demo. All the work happens in a database created for the run and dropped at
    the end, together with every worker thread and the embedded server, on success, error or
    Ctrl-C. ``schema``: put the queue's tables in that schema of it (``Jobs(schema=...)``).
    """
    console = Console()
    console.say("sqla-jobs demo: a Postgres job queue in one table, on a real database", indent=0)
    stack = contextlib.ExitStack()
    try:
        try:
            console.step(1, "The database")
            server_url = server(console, stack, database_url)
            url = create_database(console, stack, server_url)
            demo = Demo(console, url, schema)
            stack.callback(demo.close)
            run(demo)
        finally:
            console.say()
            with sigint_deferred(reraise=False):
                stack.close()
    except KeyboardInterrupt:
        print("sqla-jobs demo: interrupted; everything it started is stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ServerUnusable as exc:
        print(f"sqla-jobs demo: {exc}", file=sys.stderr)
        return exc.code
    except Exception:
        traceback.print_exc()
        print(
            "sqla-jobs demo: failed (see above); everything it started is stopped", file=sys.stderr
        )
        return EXIT_ERROR
    console.say(f"demo finished in {time.time() - console.started:.1f} s", indent=0)
    return EXIT_OK


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="The guided tour of sqla-jobs on a throw-away database: enqueue with a "
        "business row, workers, backoff, dead jobs, a rescued crash, SKIP LOCKED measured.",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="the server to create the demo's database on (default: DATABASE_URL, else an "
        "embedded PostgreSQL)",
    )
    parser.add_argument(
        "--schema",
        default=None,
        help="a schema of the demo's database to put the queue's tables in (created by the demo)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    sys.exit(main(database_url=args.database_url, schema=args.schema))
