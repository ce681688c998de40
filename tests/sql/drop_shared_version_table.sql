
DROP TABLE alembic_version
