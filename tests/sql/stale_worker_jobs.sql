SELECT sqla_jobs_job.id, sqla_jobs_job.locked_by, date_part('epoch', now() - sqla_jobs_worker.heartbeat_at) AS heartbeat_age, sqla_jobs_job.lease_expires_at 
FROM sqla_jobs_job JOIN sqla_jobs_worker ON sqla_jobs_worker.name = sqla_jobs_job.locked_by 
WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.state = 'running' AND sqla_jobs_worker.expires_at < now() ORDER BY sqla_jobs_job.id
