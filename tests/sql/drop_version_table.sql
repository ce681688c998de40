
DROP TABLE sqla_jobs_alembic_version
