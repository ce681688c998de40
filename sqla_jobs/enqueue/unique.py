"""Enqueue of unique jobs: ``INSERT ... ON CONFLICT`` on the unique index, in the caller's Session.

A duplicate never raises a database error, so the caller's transaction stays usable: the insert
does nothing (or updates the pending holder, for ``replace``), and a second statement finds the
job holding the key. Under READ COMMITTED that statement sees the holder whose commit made the
insert skip; if the holder left its counted states in between (it finished), the insert is tried
again. Plain jobs of a mixed ``enqueue_many`` take the plain path (:mod:`sqla_jobs.enqueue.insert`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from sqla_jobs.db.direct import exec_options
from sqla_jobs.enqueue.due import announce
from sqla_jobs.enqueue.insert import (
    _JOB_BIND,
    _ONE_US,
    _attach,
    _many_params,
    _one_params,
    wake,
)
from sqla_jobs.enqueue.insert import enqueue_many as _plain_many
from sqla_jobs.enqueue.row import Batch, Prepared
from sqla_jobs.enqueue.wakeup import Wakeup, due_now
from sqla_jobs.errors import DuplicateJobError, SqlaJobsError
from sqla_jobs.model import ENQUEUED, Job
from sqla_jobs.sql import enqueue as enqueue_sql
from sqla_jobs.sql import unique as unique_sql
from sqla_jobs.unique import EnqueuedIds, OnConflict, UniqueKey

_INSERT = {False: unique_sql.insert_unique_job(), True: unique_sql.upsert_unique_job()}
_INSERT_MANY = {False: unique_sql.insert_unique_jobs(), True: unique_sql.upsert_unique_jobs()}
_FIND = unique_sql.find_unique_job()
_FIND_MANY = unique_sql.find_unique_jobs()
#: Inserts tried while the holder of a key keeps finishing between the insert and the lookup.
_ATTEMPTS = 5


def _unique_params(key: UniqueKey) -> dict[str, Any]:
    return {"unique_key": key.key, "unique_states": list(key.states), "unique_period": key.period}


def _notify(
    session: Session,
    wakeup: Wakeup,
    queues: list[str],
    run_at: datetime | None,
    delay: timedelta,
    options: dict[str, Any],
) -> None:
    conn = session.connection(bind_arguments=_JOB_BIND)
    due = due_now(run_at, delay // _ONE_US)
    wake(session, conn, wakeup, queues, due, options)
    if not due:
        announce(session, wakeup, queues, run_at, delay // _ONE_US)


def enqueue(
    session: Session,
    job: Prepared,
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    wakeup: Wakeup,
    on_conflict: OnConflict,
) -> Job:
    """Insert one unique job unless its key is taken; returns the inserted job, or the one
    holding the key (``Job.inserted`` False), or raises :class:`DuplicateJobError` for
    ``on_conflict="raise"`` with nothing written."""
    assert job.unique is not None
    conn = session.connection(bind_arguments=_JOB_BIND)
    options = exec_options(schema)
    values = job.values()
    params = {**_one_params(values, run_at, delay), **_unique_params(job.unique)}
    replace = on_conflict == "replace"
    for _ in range(_ATTEMPTS):
        row = conn.execute(_INSERT[replace], params, execution_options=options).one_or_none()
        if row is not None and row.inserted:
            _notify(session, wakeup, [job.queue], run_at, delay, options)
            obj = _attach(session, values, row[: len(enqueue_sql.FILLED_COLUMNS)])
            obj.__dict__.update(unique_key=row.unique_key, unique_states=list(job.unique.states))
            obj.__dict__[ENQUEUED] = "inserted"
            return obj
        if row is not None:  # replaced: the holder was pending
            _notify(session, wakeup, [job.queue], run_at, delay, options)
            replaced = session.get(Job, row.id, populate_existing=True, execution_options=options)
            assert replaced is not None
            replaced.__dict__[ENQUEUED] = "replaced"
            return replaced
        holder: Job | None = (
            session.execute(_FIND, params, execution_options={**options, "populate_existing": True})
            .scalars()
            .first()
        )
        if holder is None:
            continue  # it finished since: the key is free, try again
        if on_conflict == "raise":
            raise DuplicateJobError(
                f"a job of kind {job.kind.name!r} with unique key {job.unique.key!r} already "
                f"exists (job {holder.id}, {holder.state}): nothing was enqueued",
                [holder.id],
                [0],
            )
        holder.__dict__[ENQUEUED] = "duplicate"
        return holder
    raise SqlaJobsError(
        f"unique key {job.unique.key!r} kept changing hands during enqueue; try again"
    )


def _take(batch: Batch, positions: list[int]) -> Batch:
    """The jobs of ``batch`` at ``positions``, as a batch of their own."""
    part = Batch()
    part.columns = [[column[i] for i in positions] for column in batch.columns]
    return part


def enqueue_many(
    session: Session,
    chunks: Iterator[Batch],
    run_at: datetime | None,
    delay: timedelta,
    *,
    schema: str | None,
    wakeup: Wakeup,
    on_conflict: OnConflict,
) -> EnqueuedIds:
    """Insert many jobs, some unique: every payload is validated first, duplicates inside the
    batch are folded (the first wins; with ``replace``, the last), the unique ones go in one
    statement in key order, the others by the plain path. Returns the ids in payload order."""
    whole = Batch()
    for batch in chunks:
        whole.absorb(batch)
    n = len(whole)
    keys = whole.unique or [None] * n
    first: dict[str, int] = {}  # key -> the position whose values are written
    for i, key in enumerate(keys):
        if key is not None and (key.key not in first or on_conflict == "replace"):
            if key.key in first and on_conflict == "raise":
                break
            first[key.key] = i
    dupes = [i for i, k in enumerate(keys) if k is not None and first[k.key] != i]
    if dupes and on_conflict == "raise":
        raise DuplicateJobError(
            f"payload {dupes[0]}: its unique key is also the key of an earlier payload of this "
            "batch: nothing was enqueued",
            [],
            dupes,
        )
    ids = [0] * n
    inserted = [False] * n
    replaced = [False] * n
    reps = sorted(first.values())
    if reps:
        nested = session.begin_nested() if on_conflict == "raise" else None
        done = _insert_unique(session, whole, reps, run_at, delay, schema, on_conflict)
        taken = [i for i in reps if not done[i][1]]
        if nested is not None:
            if taken:
                nested.rollback()
                raise DuplicateJobError(
                    f"payload {taken[0]}: a job with its unique key already exists (job "
                    f"{done[taken[0]][0]}): nothing was enqueued",
                    [done[i][0] for i in taken],
                    taken,
                )
            nested.commit()
        for i in reps:
            ids[i], inserted[i], replaced[i] = done[i]
        _notify(
            session,
            wakeup,
            [whole.column("queue")[i] for i in reps if inserted[i] or replaced[i]],
            run_at,
            delay,
            exec_options(schema),
        )
        for i in dupes:
            ids[i] = ids[first[keys[i].key]]  # type: ignore[union-attr]
    plain = [i for i, k in enumerate(keys) if k is None]
    if plain:
        part = _take(whole, plain)
        plain_ids = _plain_many(
            session, len(part), iter([part]), run_at, delay, schema=schema, wakeup=wakeup
        )
        for i, job_id in zip(plain, plain_ids, strict=True):
            ids[i], inserted[i] = job_id, True
    replaced_flags = replaced if on_conflict == "replace" else None
    return EnqueuedIds(ids, inserted, replaced_flags)


def _insert_unique(
    session: Session,
    whole: Batch,
    reps: list[int],
    run_at: datetime | None,
    delay: timedelta,
    schema: str | None,
    on_conflict: OnConflict,
) -> dict[int, tuple[int, bool, bool]]:
    """Insert the unique jobs at ``reps`` (distinct keys); per position: (id, inserted,
    replaced), the id being the holder's for a key that was taken."""
    assert whole.unique is not None
    conn = session.connection(bind_arguments=_JOB_BIND)
    options = exec_options(schema)
    replace = on_conflict == "replace"
    done: dict[int, tuple[int, bool, bool]] = {}
    todo = reps
    for _ in range(_ATTEMPTS):
        part = _take(whole, todo)
        keys = [whole.unique[i] for i in todo]
        unique = {
            "unique_keys": [k.key for k in keys],  # type: ignore[union-attr]
            "unique_states": [",".join(k.states) for k in keys],  # type: ignore[union-attr]
            "unique_periods": [k.period for k in keys],  # type: ignore[union-attr]
        }
        params = {**_many_params(part, run_at, delay), **unique}
        at = {k.key: i for k, i in zip(keys, todo, strict=True)}  # type: ignore[union-attr]
        for job_id, stored, new in conn.execute(
            _INSERT_MANY[replace], params, execution_options=options
        ):
            # As stored, a key with a period ends with "@<its window>".
            i = at[stored] if stored in at else at[stored.rpartition("@")[0]]
            done[i] = (job_id, bool(new), not new)
        rest = [i for i in todo if i not in done]
        if not rest:
            return done
        found: Any = conn.execute(
            _FIND_MANY,
            {
                "unique_keys": [whole.unique[i].key for i in rest],  # type: ignore[union-attr]
                "unique_periods": [whole.unique[i].period for i in rest],  # type: ignore[union-attr]
                "run_at": run_at,
                "delay_us": params["delay_us"],
            },
            execution_options=options,
        )
        for row in found:
            done[rest[row[0] - 1]] = (row[1], False, False)
        todo = [i for i in rest if i not in done]
        if not todo:
            return done
    raise SqlaJobsError("unique keys kept changing hands during enqueue_many; try again")
