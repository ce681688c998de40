DELETE FROM sqla_jobs_job USING unnest(%(ids)s::BIGINT[], %(tokens)s::UUID[]) AS held(id, token) WHERE sqla_jobs_job.id = held.id AND sqla_jobs_job.lease_token = held.token RETURNING sqla_jobs_job.id
