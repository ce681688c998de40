SELECT sqla_jobs_job.id, sqla_jobs_job.state, sqla_jobs_job.queue, sqla_jobs_job.cancel_requested_at IS NOT NULL AS anon_1, sqla_jobs_job.unique_key IS NOT NULL AS anon_2 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) ORDER BY sqla_jobs_job.id FOR UPDATE
