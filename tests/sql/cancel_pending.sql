UPDATE sqla_jobs_job SET state='cancelled', finished_at=now() WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.state IN ('pending', 'waiting') RETURNING sqla_jobs_job.id
