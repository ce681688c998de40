DELETE FROM sqla_jobs_job WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.lease_token = %(token)s::UUID RETURNING sqla_jobs_job.id
