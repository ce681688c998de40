SELECT pg_advisory_unlock(-1196525586, hashtext('sqla_jobs.prune:' || coalesce(%(schema_name)s::VARCHAR, ''))) AS pg_advisory_unlock_1
