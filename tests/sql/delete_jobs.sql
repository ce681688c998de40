DELETE FROM sqla_jobs_job WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.state = any(%(states)s::TEXT[]) RETURNING sqla_jobs_job.id
