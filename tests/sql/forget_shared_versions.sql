DELETE FROM alembic_version WHERE alembic_version.version_num = any(%(revisions)s::TEXT[])
