"""Job dependencies: the edges (``sqla_jobs_dependency``), the outcomes of finished parents
(``sqla_jobs_outcome``), and the triggers that keep a waiting child exact.

Who does what, all inside the transaction that changes the job:

- A parent marked ``has_dependents`` that ends (deleted by its completion, or moved to
  ``completed``, ``dead`` or ``cancelled`` by any path: fail, reap, cancel, discard, kept) has
  its outcome written by a row trigger whose ``WHEN`` is false for every other job, so a job
  without dependents does no dependency work.
- At commit, a deferred trigger takes every outcome this transaction wrote and settles the
  children at once: locked in id order (two batched completions cannot deadlock on them),
  their ``waiting_on`` counter decremented under the lock (exact however many parents end
  concurrently), released to ``pending`` (and NOTIFY) at 0, or cancelled with the parent's id
  and outcome in ``errors`` (and so on down, as the cancel is itself an end).
- When a child's edges are inserted, a statement trigger gives it its first state (``waiting``
  on its unfinished parents, or ``cancelled`` for a failed one); it refuses an edge to a job
  this transaction did not enqueue.
- At the commit of a child's enqueue, a deferred trigger marks its parents ``has_dependents``
  (locking them in id order), recounts their states and fixes the child: a parent that ended
  while the child's transaction was open, before it could see the child's edge, is counted
  here. A parent's completion waits at most for this commit, never for the open transaction.

The functions are ``SECURITY DEFINER`` (their owner's rights, a fixed ``search_path``; a trigger
function cannot be called directly): the enqueuer, the worker and the operator of
docs/roles.md need no grant on what a trigger writes for them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Index, Text, event, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from sqla_jobs.model.names import (
    DEPENDENCY_TABLE,
    JOB_TABLE,
    MAX_ERROR_CHARS,
    OUTCOME_TABLE,
    PREFIX,
    Base,
    metadata,
)


class Dependency(Base):
    """One edge: job ``child_id`` runs only after job ``parent_id`` completed. No foreign key:
    a parent's row is deleted when it completes, and the edge is still read afterwards."""

    __tablename__ = DEPENDENCY_TABLE

    parent_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    child_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    #: The child runs even if this parent ends dead, cancelled or deleted
    #: (``on_parent_failure="run"``).
    run_anyway: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))

    __table_args__ = (Index(f"{DEPENDENCY_TABLE}_child_id_idx", "child_id"),)


class JobOutcome(Base):
    """How a job that others depended on ended (``completed``, ``dead``, ``cancelled`` or
    ``deleted``): read by a child enqueued after its parent's row is gone; and the result of a
    completed job of a kind with ``results=True`` (with dependents or not). Pruned with the
    retention of dead jobs."""

    __tablename__ = OUTCOME_TABLE

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    outcome: Mapped[str] = mapped_column(Text)
    finished_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    #: True from the end until the commit-time trigger has settled the children (this
    #: transaction's only); NULL after.
    unsettled: Mapped[bool | None] = mapped_column(Boolean)
    #: What the handler of a kind with ``results=True`` returned (JSON; NULL: no result stored).
    #: Written by the completion's own statement; the outcome trigger's upsert leaves it alone.
    result: Mapped[Any | None] = mapped_column(JSONB)

    __table_args__ = (
        Index(f"{OUTCOME_TABLE}_finished_at_idx", "finished_at"),
        Index(f"{OUTCOME_TABLE}_unsettled_idx", "id", postgresql_where=text("unsettled")),
    )


#: The functions the triggers call (dropped by the downgrade; tables take their triggers along).
FUNCTIONS = (
    f"{PREFIX}_record_outcome",
    f"{PREFIX}_settle",
    f"{PREFIX}_check_child",
    f"{PREFIX}_start_children",
)

# The NOTIFY of a released child, on the channel of a Jobs(schema=None) and on the schema's.
_NOTIFY = """
      PERFORM pg_notify('sqla_jobs', r_queue);
      PERFORM pg_notify('sqla_jobs.' || TG_TABLE_SCHEMA, r_queue);"""

# The cancel of child ``r_id`` because parent ``bad_id`` ended ``bad_outcome``.
_CANCEL = f"""
      UPDATE {JOB_TABLE} SET state = 'cancelled', finished_at = now(),
             last_error = left(format('parent job %s ended %s', bad_id, bad_outcome),
                               {MAX_ERROR_CHARS}),
             errors = coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                 'attempt', attempts, 'at', now(), 'error', 'ParentFailed',
                 'message', format('parent job %s ended %s', bad_id, bad_outcome),
                 'traceback', NULL, 'parent', bad_id, 'parent_outcome', bad_outcome))
       WHERE id = r_id;"""

# Child ``r_id``'s parents counted where they stand now: ``unfinished`` ones, and the first
# failed one (``bad_id``, not run anyway), which cancels the child; ends inside an IF whose ELSE
# the caller writes.
_RECOUNT = f"""
  SELECT count(*) FILTER (WHERE coalesce(j.state, o.outcome) IN ('pending', 'running', 'waiting')),
         min(d.parent_id) FILTER (WHERE NOT d.run_anyway
             AND coalesce(j.state, o.outcome) IN ('dead', 'cancelled', 'deleted'))
    INTO unfinished, bad_id
    FROM {DEPENDENCY_TABLE} d
    LEFT JOIN {JOB_TABLE} j ON j.id = d.parent_id
    LEFT JOIN {OUTCOME_TABLE} o ON o.id = d.parent_id
   WHERE d.child_id = r_id;
  IF bad_id IS NOT NULL THEN
    SELECT coalesce(j.state, o.outcome) INTO bad_outcome
      FROM (SELECT bad_id AS id) b
      LEFT JOIN {JOB_TABLE} j ON j.id = b.id LEFT JOIN {OUTCOME_TABLE} o ON o.id = b.id;{_CANCEL}"""

_RECORD = f"""
DECLARE
  ended text;
BEGIN
  IF TG_OP = 'DELETE' THEN
    -- A worker deletes the running job it completed; any other delete is not a success.
    ended := CASE OLD.state WHEN 'running' THEN 'completed' ELSE 'deleted' END;
  ELSE
    ended := NEW.state;
  END IF;
  INSERT INTO {OUTCOME_TABLE} (id, outcome, finished_at, unsettled)
  VALUES (OLD.id, ended, now(), true)
  ON CONFLICT (id) DO UPDATE
     SET outcome = EXCLUDED.outcome, finished_at = EXCLUDED.finished_at, unsettled = true;
  RETURN NULL;
END"""

_SETTLE = f"""
DECLARE
  parents bigint[];
  outcomes text[];
  r_id bigint;
  r_queue text;
  done integer;
  bad_id bigint;
  bad_outcome text;
  released boolean;
BEGIN
  WITH s AS (UPDATE {OUTCOME_TABLE} SET unsettled = NULL WHERE unsettled RETURNING id, outcome)
  SELECT array_agg(id ORDER BY id), array_agg(outcome ORDER BY id) INTO parents, outcomes FROM s;
  IF parents IS NULL THEN
    RETURN NULL;  -- settled by this transaction's first event
  END IF;
  -- One lock order for every completer: children by id.
  FOR r_id, r_queue IN
    SELECT j.id, j.queue FROM {JOB_TABLE} j
     WHERE j.id IN (SELECT d.child_id FROM {DEPENDENCY_TABLE} d WHERE d.parent_id = ANY (parents))
       AND j.state = 'waiting'
     ORDER BY j.id FOR NO KEY UPDATE OF j
  LOOP
    SELECT count(*) FILTER (WHERE p.outcome = 'completed' OR d.run_anyway),
           min(p.id) FILTER (WHERE p.outcome <> 'completed' AND NOT d.run_anyway)
      INTO done, bad_id
      FROM {DEPENDENCY_TABLE} d JOIN unnest(parents, outcomes) AS p(id, outcome) ON p.id = d.parent_id
     WHERE d.child_id = r_id;
    IF bad_id IS NOT NULL THEN
      bad_outcome := outcomes[array_position(parents, bad_id)];{_CANCEL}
    ELSE
      UPDATE {JOB_TABLE} SET waiting_on = greatest(waiting_on - done, 0),
             state = CASE WHEN waiting_on - done <= 0 THEN 'pending' ELSE 'waiting' END
       WHERE id = r_id
      RETURNING state = 'pending' AND run_at <= now() INTO released;
      IF released THEN{_NOTIFY}
      END IF;
    END IF;
  END LOOP;
  RETURN NULL;
END"""

_CHECK_CHILD = f"""
DECLARE
  r_id bigint := NEW.child_id;
  r_queue text;
  unfinished integer;
  bad_id bigint;
  bad_outcome text;
  released boolean;
BEGIN
  -- One check per child: its edges are inserted together, and their events fire in a row.
  IF current_setting('sqla_jobs.checked_child', true) = r_id::text THEN
    RETURN NULL;
  END IF;
  PERFORM set_config('sqla_jobs.checked_child', r_id::text, true);
  PERFORM 1 FROM {JOB_TABLE} WHERE id = r_id AND state = 'waiting';
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  -- Parents locked in id order: a completion still open is waited for (and ends before the
  -- recount below); one that comes after this commit sees has_dependents and the edge.
  PERFORM 1 FROM {JOB_TABLE}
   WHERE id IN (SELECT parent_id FROM {DEPENDENCY_TABLE} WHERE child_id = r_id)
   ORDER BY id FOR NO KEY UPDATE;
  UPDATE {JOB_TABLE} SET has_dependents = true
   WHERE id IN (SELECT parent_id FROM {DEPENDENCY_TABLE} WHERE child_id = r_id)
     AND has_dependents IS NOT TRUE;
  -- A parent gone without an outcome ended while this transaction was open: its completion
  -- deleted it before it could see this child.
{_RECOUNT}
  ELSE
    UPDATE {JOB_TABLE} SET waiting_on = unfinished,
           state = CASE WHEN unfinished = 0 THEN 'pending' ELSE 'waiting' END
     WHERE id = r_id
    RETURNING state = 'pending' AND run_at <= now(), queue INTO released, r_queue;
    IF released THEN{_NOTIFY}
    END IF;
  END IF;
  RETURN NULL;
END"""


_START_CHILDREN = f"""
DECLARE
  r_id bigint;
  unfinished integer;
  bad_id bigint;
  bad_outcome text;
BEGIN
  FOR r_id IN SELECT DISTINCT child_id FROM new_edges ORDER BY 1 LOOP
    -- Only a job enqueued by this very transaction gets parents: edges on another's job would
    -- let an enqueuer hold, release or cancel it through these functions' rights.
    PERFORM 1 FROM {JOB_TABLE}
     WHERE id = r_id AND created_at = now() AND state = 'pending' AND attempts = 0
       AND waiting_on IS NULL;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = 'job ' || r_id
        || ' was not enqueued by this transaction: it cannot be given parents';
    END IF;
{_RECOUNT}
    ELSIF unfinished > 0 THEN
      UPDATE {JOB_TABLE} SET state = 'waiting', waiting_on = unfinished WHERE id = r_id;
    END IF;
  END LOOP;
  RETURN NULL;
END"""


def workflow_ddl(schema: str | None) -> list[str]:
    """The functions and triggers of job dependencies, for the tables in ``schema`` (None: the
    search_path's, captured when they are created). Run after the three tables exist; the
    migration ``sqla_jobs_0008`` and ``create_all`` both run it."""
    q = "" if schema is None else f'"{schema}".'
    path = "FROM CURRENT" if schema is None else f'= "{schema}"'

    def function(name: str, body: str) -> str:
        return (
            f"CREATE OR REPLACE FUNCTION {q}{name}() RETURNS trigger LANGUAGE plpgsql"
            f" SECURITY DEFINER SET search_path {path} AS $sqla_jobs${body}\n$sqla_jobs$"
        )

    ended = "NEW.state IN ('completed', 'dead', 'cancelled')"
    return [
        function(FUNCTIONS[0], _RECORD),
        function(FUNCTIONS[1], _SETTLE),
        function(FUNCTIONS[2], _CHECK_CHILD),
        function(FUNCTIONS[3], _START_CHILDREN),
        # A job without dependents never gets past WHEN: no function call, nothing queued.
        f"CREATE TRIGGER {JOB_TABLE}_ended AFTER UPDATE OF state ON {q}{JOB_TABLE}"
        f" FOR EACH ROW WHEN (OLD.has_dependents AND {ended} AND OLD.state <> NEW.state)"
        f" EXECUTE FUNCTION {q}{FUNCTIONS[0]}()",
        f"CREATE TRIGGER {JOB_TABLE}_deleted AFTER DELETE ON {q}{JOB_TABLE}"
        " FOR EACH ROW WHEN (OLD.has_dependents AND OLD.state IN ('pending', 'running', 'waiting'))"
        f" EXECUTE FUNCTION {q}{FUNCTIONS[0]}()",
        f"CREATE CONSTRAINT TRIGGER {OUTCOME_TABLE}_settle AFTER INSERT OR UPDATE"
        f" ON {q}{OUTCOME_TABLE} DEFERRABLE INITIALLY DEFERRED"
        f" FOR EACH ROW WHEN (NEW.unsettled) EXECUTE FUNCTION {q}{FUNCTIONS[1]}()",
        # A new child's first state, from its parents' as this statement sees them.
        f"CREATE TRIGGER {DEPENDENCY_TABLE}_start AFTER INSERT ON {q}{DEPENDENCY_TABLE}"
        " REFERENCING NEW TABLE AS new_edges FOR EACH STATEMENT"
        f" EXECUTE FUNCTION {q}{FUNCTIONS[3]}()",
        f"CREATE CONSTRAINT TRIGGER {DEPENDENCY_TABLE}_check AFTER INSERT"
        f" ON {q}{DEPENDENCY_TABLE} DEFERRABLE INITIALLY DEFERRED"
        f" FOR EACH ROW EXECUTE FUNCTION {q}{FUNCTIONS[2]}()",
    ]


def _create_triggers(target: Any, connection: Any, **kw: Any) -> None:
    # create_all() builds what the migration does; the schema comes from the translate map.
    names = {t.name for t in kw.get("tables") or target.sorted_tables}
    if not {JOB_TABLE, DEPENDENCY_TABLE, OUTCOME_TABLE} <= names:
        return
    translate = connection.get_execution_options().get("schema_translate_map") or {}
    for statement in workflow_ddl(translate.get(None)):
        connection.exec_driver_sql(statement.replace("%", "%%"))


event.listen(metadata, "after_create", _create_triggers)
