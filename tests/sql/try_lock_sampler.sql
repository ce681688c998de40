SELECT pg_try_advisory_lock(-1196525586, hashtext('sqla_jobs.sample:' || coalesce(%(schema_name)s::VARCHAR, ''))) AS pg_try_advisory_lock_1
