"""``sqla-jobs migrate``: run the shipped revisions without an Alembic environment of your own.

The revisions are recorded in a version table of sqla-jobs' own, ``sqla_jobs_alembic_version``, in
the schema of the tables; never in ``alembic_version``, which belongs to the application's Alembic
environment: this command neither needs to know the application's revisions nor touches them.

Which tool runs sqla-jobs' revisions is read from the database before anything runs:

- ``sqla_jobs_alembic_version`` holds a revision: this command does; it upgrades from there.
- ``alembic_version`` holds sqla-jobs' revisions and nothing else: an earlier ``sqla-jobs
  migrate`` recorded them there. They move to ``sqla_jobs_alembic_version`` (the emptied table is
  dropped) and the upgrade runs only what is not applied yet.
- ``alembic_version`` holds them beside the application's revisions: the application's
  environment runs them (docs/migrations.md). Refused, unless ``adopt`` hands them over to this
  command, once that environment no longer lists sqla-jobs' revisions.
- No revision recorded, but the job table exists: another environment made it (one whose
  revisions depend on sqla-jobs', for which Alembic records only its own). Refused.
- None of these: a fresh database; everything is created.

The lock, the hand-over and the upgrade share one transaction (PostgreSQL's DDL is
transactional): a failure leaves the database as it was, and two runs at once (a deploy's
replicas) run one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect
from sqlalchemy.pool import NullPool

from sqla_jobs.db.urls import sqlalchemy_url
from sqla_jobs.errors import MigrationConflictError
from sqla_jobs.model import JOB_TABLE, PREFIX, VERSION_TABLE
from sqla_jobs.sql import catalog as catalog_sql

#: What ``sqla-jobs migrate`` upgrades to: the head of the ``sqla_jobs`` branch.
TARGET = "sqla_jobs@head"
#: Alembic's default version table: the application's environment's, and an earlier migrate's.
SHARED_TABLE = "alembic_version"
#: Every shipped revision id starts with this, so that sqla-jobs' rows in a table shared with an
#: application are known even when this release does not ship them (a newer one applied them).
REVISION_PREFIX = f"{PREFIX}_"


@dataclass(frozen=True)
class Migrated:
    """What :func:`upgrade` did: sqla-jobs' revisions before and after it (in its own version
    table), and those it took over from ``alembic_version`` first."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    adopted: tuple[str, ...] = ()
    schema: str | None = None

    def summary(self) -> str:
        """One line per thing done, for ``sqla-jobs migrate``'s output."""
        own = _qualified(self.schema, VERSION_TABLE)
        lines = []
        if self.adopted:
            lines.append(
                f"moved {', '.join(self.adopted)} from {_qualified(self.schema, SHARED_TABLE)} "
                f"to {own}, where sqla-jobs migrate records its revisions"
            )
        after = ", ".join(self.after)
        if not self.before:
            lines.append(f"created sqla-jobs' tables: {after} (recorded in {own})")
        elif self.before == self.after:
            lines.append(f"sqla-jobs' tables are up to date: {after} (recorded in {own})")
        else:
            lines.append(f"upgraded sqla-jobs' tables from {', '.join(self.before)} to {after}")
        return "\n".join(lines)


def alembic_config(url: str, schema: str | None = None) -> Config:
    """An in-memory Alembic config running ``sqla_jobs:migrations`` against ``url``."""
    cfg = Config()
    cfg.set_main_option("script_location", "sqla_jobs:migrations")
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    if schema is not None:
        cfg.attributes["sqla_jobs_schema"] = schema
    return cfg


def upgrade(
    url: str, *, schema: str | None = None, sql: bool = False, adopt: bool = False
) -> Migrated:
    """Upgrade sqla-jobs' tables on ``url`` to the newest shipped revision, recording them in
    ``sqla_jobs_alembic_version`` (module docstring: what it takes over, what it refuses).

    ``sql=True`` prints the SQL from an empty database instead, without connecting. ``adopt``
    takes sqla-jobs' revisions out of an ``alembic_version`` shared with the application's.
    Raises :class:`~sqla_jobs.errors.MigrationConflictError`, having changed nothing, when
    another environment runs them; all or nothing otherwise (one transaction)."""
    cfg = alembic_config(url, schema)
    if sql:
        command.upgrade(cfg, TARGET, sql=True)
        return Migrated((), (), schema=schema)
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(catalog_sql.lock_migrations(), {"schema_name": schema})
            adopted = _settle(conn, cfg, schema, adopt=adopt)
            before = _heads(conn, VERSION_TABLE, schema)
            # Alembic runs in this transaction (it sees one open and begins none of its own).
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, TARGET)
            after = _heads(conn, VERSION_TABLE, schema)
    finally:
        engine.dispose()
    return Migrated(before, after, adopted, schema)


def downgrade(url: str, *, schema: str | None = None) -> None:
    """``alembic downgrade sqla_jobs@base``, then drop sqla-jobs' version table: every object
    sqla-jobs created is gone. A database another environment migrates is refused as by
    :func:`upgrade`; one an earlier ``sqla-jobs migrate`` migrated is taken over first."""
    cfg = alembic_config(url, schema)
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(catalog_sql.lock_migrations(), {"schema_name": schema})
            _settle(conn, cfg, schema, adopt=False)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "sqla_jobs@base")
            conn.execute(catalog_sql.drop_version_table(), execution_options=_options(schema))
    finally:
        engine.dispose()


def _settle(conn: Connection, cfg: Config, schema: str | None, *, adopt: bool) -> tuple[str, ...]:
    """Make sure this command runs sqla-jobs' revisions on ``conn`` (module docstring), taking
    them over from ``alembic_version`` where it may; returns those it took over."""
    own = _heads(conn, VERSION_TABLE, schema)
    shared = _heads(conn, SHARED_TABLE, schema)
    ours = tuple(r for r in shared if r.startswith(REVISION_PREFIX))
    theirs = tuple(r for r in shared if not r.startswith(REVISION_PREFIX))
    own_table = _qualified(schema, VERSION_TABLE)
    shared_table = _qualified(schema, SHARED_TABLE)
    if own and ours:
        raise MigrationConflictError(
            f"sqla-jobs' revisions are recorded twice, in {own_table} ({', '.join(own)}) and in "
            f"{shared_table} ({', '.join(ours)}); nothing was run. If your Alembic environment "
            f"runs them, drop {own_table} and run `alembic upgrade heads`; if sqla-jobs migrate "
            f"does, delete those rows from {shared_table}"
        )
    if own:
        return ()
    if ours and theirs and not adopt:
        raise MigrationConflictError(
            f"{shared_table} holds sqla-jobs' revisions ({', '.join(ours)}) beside your "
            f"application's ({', '.join(theirs)}): your Alembic environment runs them, so run "
            "`alembic upgrade heads` there; nothing was run. To hand them to sqla-jobs migrate "
            "instead, remove sqla_jobs:migrations/versions from that environment's "
            "version_locations, then run `sqla-jobs migrate --adopt`"
        )
    if ours:
        _adopt(conn, cfg, schema, ours, drop_shared=not theirs)
        return ours
    if inspect(conn).has_table(JOB_TABLE, schema=schema):
        raise MigrationConflictError(
            f"{_qualified(schema, JOB_TABLE)} exists but no sqla-jobs revision is recorded, "
            f"neither in {own_table} nor in {shared_table}: sqla-jobs migrate did not create it "
            "(an Alembic environment whose revisions depend on sqla-jobs' records only its own); "
            "migrate it where it was made, e.g. `alembic upgrade heads`; nothing was run"
        )
    return ()


def _adopt(
    conn: Connection, cfg: Config, schema: str | None, ours: tuple[str, ...], *, drop_shared: bool
) -> None:
    """Record ``ours`` in sqla-jobs' version table and remove them (only them) from
    ``alembic_version``; drop that table if nothing else was in it."""
    script = ScriptDirectory.from_config(cfg)
    own = _context(conn, VERSION_TABLE, schema)
    for revision in ours:
        own.stamp(script, revision)
    options = _options(schema)
    conn.execute(
        catalog_sql.forget_shared_versions(), {"revisions": list(ours)}, execution_options=options
    )
    if drop_shared:
        conn.execute(catalog_sql.drop_shared_version_table(), execution_options=options)


def _context(conn: Connection, table: str, schema: str | None) -> MigrationContext:
    return MigrationContext.configure(
        conn, opts={"version_table": table, "version_table_schema": schema}
    )


def _heads(conn: Connection, table: str, schema: str | None) -> tuple[str, ...]:
    """The revisions recorded in ``schema.table`` (none if it does not exist)."""
    return _context(conn, table, schema).get_current_heads()


def _options(schema: str | None) -> dict[str, object]:
    return {} if schema is None else {"schema_translate_map": {None: schema}}


def _qualified(schema: str | None, name: str) -> str:
    return name if schema is None else f"{schema}.{name}"
