SELECT pg_advisory_xact_lock(-1196525586, hashtext('sqla_jobs.migrate:' || coalesce(%(schema_name)s::VARCHAR, ''))) AS pg_advisory_xact_lock_1
