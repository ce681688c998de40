UPDATE sqla_jobs_job SET lease_expires_at=(now() + %(lease)s) WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.lease_token = any(%(tokens)s::UUID[]) RETURNING sqla_jobs_job.id
