"""``sqla-jobs jobs`` and ``sqla-jobs queues``: the operations of :mod:`sqla_jobs.operations.facade` for a
person at a terminal, and their listings (:mod:`sqla_jobs.cli.listings`).

Each command opens its own Session, runs one API call (or one read), commits, and prints what it
changed. Errors are one line on stderr: an unknown id or a job in the wrong state exits 6
(``EXIT_NOT_APPLICABLE``), a bad filter or name exits 2; either way nothing changed, because the
API checks everything before its first write and the transaction is rolled back.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_jobs.cli import confirm, listings
from sqla_jobs.cli.common import (
    EXIT_NOT_APPLICABLE,
    EXIT_OK,
    CLIError,
    add_database_options,
    checked_name,
    prepared_url,
)
from sqla_jobs.cli.reads import add_read_option, read
from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.errors import QueueInUseError, UnknownQueueError
from sqla_jobs.jobs import Jobs
from sqla_jobs.observe.stats import queue_overview
from sqla_jobs.operations import jobs as _ops
from sqla_jobs.operations.jobs import FILTER_LIMIT, RUNNING_CANCEL_NOTE, Bound, said
from sqla_jobs.operations.relatives import relatives

Command = Callable[[argparse.Namespace], int]


@contextmanager
def open_session(args: argparse.Namespace) -> Iterator[tuple[Jobs, Session]]:
    """A ``Jobs`` for ``--schema`` and a Session on ``--database-url``, after the preflight check;
    the engine is disposed of on the way out."""
    jobs = Jobs(schema=getattr(args, "schema", None))
    url = prepared_url(args)
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with Session(engine) as session:
            yield jobs, session
    finally:
        engine.dispose()


def job_ids(values: Sequence[str]) -> list[int]:
    """Job ids from the command line, each a positive whole number (else a usage error)."""
    out = []
    for value in values:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1 or number >= 2**63:
            raise CLIError(f"invalid job id {value!r}: ids are whole numbers from 1")
        out.append(number)
    return out


def _capped(ids: Sequence[int]) -> str:
    if len(ids) < FILTER_LIMIT:
        return ""
    return f" (at most {FILTER_LIMIT:,} per run: run it again for the rest)"


@contextmanager
def _transaction(session: Session, dry_run: bool) -> Iterator[None]:
    """A transaction that commits, or with ``--dry-run`` rolls back: the operation runs and
    checks as it would, and nothing stays changed."""
    with session.begin() as transaction:
        yield
        if dry_run:
            transaction.rollback()


def _said(args: argparse.Namespace, done: str, would: str, ids: Sequence[int], what: str) -> str:
    return said(f"would {would}" if args.dry_run else done, ids, what)


def ids_or_all_dead(
    args: argparse.Namespace, verb: str
) -> tuple[list[int], str | None, str | None]:
    """The ids, kind and queue of ``jobs retry`` / ``jobs delete``: ids, or --all-dead with its
    filters, never both."""
    ids = job_ids(args.ids)
    if ids and args.all_dead:
        raise CLIError("give job ids or --all-dead, not both")
    if not ids and not args.all_dead:
        raise CLIError(f"give the ids of the jobs to {verb}, or --all-dead")
    if ids and (args.kind or args.queue):
        raise CLIError("--kind and --queue filter --all-dead; with ids, give only ids")
    return ids, checked_name("kind", args.kind), checked_name("queue", args.queue)


def _by_filter(
    args: argparse.Namespace,
    session: Session,
    jobs: Jobs,
    verb: str,
    ids: list[int],
    kind: str | None,
    queue: str | None,
) -> tuple[bool, Bound | None]:
    """For ``verb`` by filter (no ids): whether ``--dry-run`` listed it already (nothing more to
    do), and the bound a confirmation set (:mod:`sqla_jobs.cli.confirm`); by ids, neither."""
    if ids:
        return False, None
    if args.dry_run:
        confirm.dry_run(session, jobs._scope, verb, kind, queue)
        return True, None
    return False, confirm.confirmed(args, session, jobs._scope, verb, kind, queue)


def cmd_retry(args: argparse.Namespace) -> int:
    ids, kind, queue = ids_or_all_dead(args, "retry")
    with open_session(args) as (jobs, session):
        listed, bound = _by_filter(args, session, jobs, "retry", ids, kind, queue)
        if listed:
            return EXIT_OK
        with _transaction(session, args.dry_run):
            result = _ops.retry_detail(
                session, jobs._scope, ids or None, kind=kind, queue=queue, bound=bound
            )
    done = result.retried
    if not done and not result.kept:
        print("no dead jobs to retry")
    elif done:
        print(_said(args, "retried", "retry", done, "job") + _capped(done))
    if result.kept:
        kept = ", ".join(f"{i} (held by job {h})" for i, h in result.kept.items())
        verb = "would keep" if args.dry_run else "kept"
        print(f"{verb} {len(result.kept)} dead, their unique key held by another job: {kept}")
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    ids, kind, queue = ids_or_all_dead(args, "delete")
    with open_session(args) as (jobs, session):
        listed, bound = _by_filter(args, session, jobs, "delete", ids, kind, queue)
        if listed:
            return EXIT_OK
        with _transaction(session, args.dry_run):
            done = _ops.delete(
                session, jobs._scope, ids or None, kind=kind, queue=queue, bound=bound
            )
    if done:
        print(_said(args, "deleted", "delete", done, "job") + _capped(done))
    else:
        print("no dead jobs to delete")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    ids = job_ids(args.ids)
    if ids and (args.queue or args.kind):
        raise CLIError("give job ids or --queue (with --kind), not both")
    if not ids and not args.queue:
        raise CLIError("give the ids of the jobs to cancel, or --queue (and --kind)")
    kind, queue = checked_name("kind", args.kind), checked_name("queue", args.queue)
    with open_session(args) as (jobs, session):
        listed, bound = _by_filter(args, session, jobs, "cancel", ids, kind, queue)
        if listed:
            return EXIT_OK
        with _transaction(session, args.dry_run):
            result = _ops.cancel(
                session, jobs._scope, ids or None, kind=kind, queue=queue, bound=bound
            )
    if result.cancelled:
        print(_said(args, "cancelled", "cancel", result.cancelled, "pending job"))
    if result.requested:
        asked = _said(
            args,
            "asked the workers to stop",
            "ask the workers to stop",
            result.requested,
            "running job",
        )
        print(asked + RUNNING_CANCEL_NOTE)
    if not result.cancelled and not result.requested:
        print("no pending or running jobs to cancel")
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    name = _queue_name(args)
    try:
        with open_session(args) as (jobs, session), session.begin():
            change = jobs.pause_queue(session, name, known_only=not args.new)
    except UnknownQueueError as exc:
        raise CLIError(
            f"{exc}; pass --new to pause it before its first job", EXIT_NOT_APPLICABLE
        ) from None
    if not change.changed:
        print(f"queue {name} is already paused (since {_since(change.paused_at)})")
    else:
        print(f"paused queue {name}: workers claim none of its jobs until it is resumed")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    name = _queue_name(args)
    with open_session(args) as (jobs, session), session.begin():
        change = jobs.resume_queue(session, name)
    print(f"resumed queue {name}" if change.changed else f"queue {name} was not paused")
    return EXIT_OK


def cmd_forget(args: argparse.Namespace) -> int:
    name = _queue_name(args)
    try:
        with open_session(args) as (jobs, session), session.begin():
            forgotten = jobs.forget_queue(session, name, force=args.force)
            known = [] if forgotten else jobs.known_queues(session)
    except QueueInUseError as exc:
        raise CLIError(
            f"{exc}; resume it first, or pass --force to forget it anyway", EXIT_NOT_APPLICABLE
        ) from None
    if not forgotten:
        listed = ", ".join(known) if known else "none"
        raise CLIError(
            f"queue {name!r} has no stored state: nothing to forget (known queues: {listed})",
            EXIT_NOT_APPLICABLE,
        )
    print(f"forgot queue {name}: it is active, and listed only while jobs or workers name it")
    return EXIT_OK


def _queue_name(args: argparse.Namespace) -> str:
    name = checked_name("queue", args.name)
    assert name is not None  # a positional argument
    return name


def _since(when: datetime | None) -> str:
    return "-" if when is None else when.isoformat(sep=" ", timespec="seconds")


def cmd_list(args: argparse.Namespace) -> int:
    query = listings.JobQuery.from_args(args)

    def rows_and_stale(jobs: Jobs, session: Session) -> tuple[Any, ...]:
        rows = listings.list_jobs(session, jobs, query)
        return rows, listings.stale_of(session, jobs, rows)

    rows, stale = read(args, rows_and_stale)
    _print(listings.render_jobs(rows, as_json=args.json, stale=stale))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    (job_id,) = job_ids([args.id])

    def shown(jobs: Jobs, session: Session) -> str:
        job = jobs.get(session, job_id)
        if job is None:
            raise listings.not_found(job_id)
        stale = listings.stale_of(session, jobs, [job]).get(job.id)
        return listings.render_job(
            job,
            as_json=args.json,
            payload=args.payload,
            traces=args.traceback,
            stale=stale,
            relatives=relatives(session, jobs.schema, job.id),
        )

    print(read(args, shown))
    return EXIT_OK


def cmd_queues(args: argparse.Namespace) -> int:
    queues = read(args, lambda jobs, session: queue_overview(session, jobs))
    _print(listings.render_queues(queues, as_json=args.json))
    return EXIT_OK


def _print(text: str) -> None:
    # JSON lines of nothing are no lines, not one empty line.
    if text:
        print(text)


def register(sub: Any, epilog: str) -> None:
    """Add ``jobs`` and ``queues`` to the ``sqla-jobs`` sub-commands ``sub``."""

    def leaf(parent: Any, name: str, func: Command, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help, epilog=epilog)
        add_database_options(p)
        p.set_defaults(func=func)
        return p

    j = sub.add_parser("jobs", help="list, show, retry and cancel jobs", epilog=epilog)
    js = j.add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")

    ls = leaf(js, "list", cmd_list, "jobs newest first, filtered (never their payloads)")
    add_read_option(ls)
    ls.add_argument(
        "--state",
        action="append",
        help="pending, running, completed, dead or cancelled (repeat, or comma-separate)",
    )
    ls.add_argument("--queue", help="only this queue's jobs")
    ls.add_argument("--kind", help="only jobs of this kind")
    ls.add_argument(
        "--meta",
        action="append",
        metavar="KEY=VALUE",
        help="only jobs whose meta has KEY with the string VALUE (KEY:=JSON for a number, "
        "true, false, null or any JSON value); repeat to require several",
    )
    ls.add_argument(
        "--linked",
        metavar="TABLE.COLUMN=VALUE",
        help="only jobs linked to the row whose COLUMN is VALUE through the link table TABLE "
        "(a table with a foreign key to the job table; SCHEMA.TABLE.COLUMN=VALUE to name its "
        "schema), e.g. order_jobs.order_id=42",
    )
    ls.add_argument(
        "--limit",
        default="50",
        help=f"at most this many jobs (default 50, at most {listings.MAX_LIMIT})",
    )
    ls.add_argument("--json", action="store_true", help="one JSON object per job, one per line")

    sh = leaf(js, "show", cmd_show, "one job: state, counters, times, errors, steps, meta")
    add_read_option(sh)
    sh.add_argument("id", metavar="ID")
    sh.add_argument("--json", action="store_true", help="one JSON object (tracebacks included)")
    sh.add_argument("--payload", action="store_true", help="show the payload too")
    sh.add_argument("--traceback", action="store_true", help="show each error's traceback")

    rt = leaf(
        js,
        "retry",
        cmd_retry,
        "run dead, cancelled or not-yet-due jobs again now, with whole budgets",
    )
    rt.add_argument("ids", nargs="*", metavar="ID")
    rt.add_argument("--all-dead", action="store_true", help="every dead job (with the filters)")
    rt.add_argument("--kind", help="with --all-dead: only this kind")
    rt.add_argument("--queue", help="with --all-dead: only this queue")
    confirm.add_options(rt, "--all-dead")

    dl = leaf(js, "delete", cmd_delete, "delete dead, cancelled or kept completed jobs for good")
    dl.add_argument("ids", nargs="*", metavar="ID")
    dl.add_argument("--all-dead", action="store_true", help="every dead job (with the filters)")
    dl.add_argument("--kind", help="with --all-dead: only this kind")
    dl.add_argument("--queue", help="with --all-dead: only this queue")
    confirm.add_options(dl, "--all-dead")

    cn = leaf(js, "cancel", cmd_cancel, "cancel pending jobs, and stop running ones")
    cn.add_argument("ids", nargs="*", metavar="ID")
    cn.add_argument("--queue", help="every pending and running job of this queue")
    cn.add_argument("--kind", help="with --queue: only this kind")
    confirm.add_options(cn, "--queue")

    q = leaf(sub, "queues", cmd_queues, "jobs per queue and state, latency, paused or not")
    q.add_argument("--json", action="store_true", help="one JSON object per queue, one per line")
    add_read_option(q)
    qs = q.add_subparsers(dest="queues_command", metavar="COMMAND")
    for name, func, help in (
        ("pause", cmd_pause, "stop every worker from claiming the queue's jobs"),
        ("resume", cmd_resume, "let workers claim the queue's jobs again"),
        ("forget", cmd_forget, "delete the queue's stored state (its pause), for a queue unused"),
    ):
        p = qs.add_parser(name, help=help, epilog=epilog)
        add_database_options(p, suppress=True)
        p.add_argument("name", metavar="NAME")
        p.set_defaults(func=func)
        if name == "pause":
            p.add_argument(
                "--new",
                action="store_true",
                help="pause a queue no job, schedule or live worker names yet (else refused, "
                "exit 6, as a likely typo)",
            )
        elif name == "forget":
            p.add_argument(
                "--force",
                action="store_true",
                help="forget a paused queue still in use (its jobs, a schedule or a live worker "
                "name it): this resumes it",
            )
