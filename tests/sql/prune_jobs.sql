DELETE FROM sqla_jobs_job WHERE sqla_jobs_job.id = any(array((SELECT sqla_jobs_job.id 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state IN ('completed', 'dead', 'cancelled') AND sqla_jobs_job.state = %(state)s::VARCHAR AND sqla_jobs_job.finished_at < now() - %(older_than_us)s::BIGINT * interval '1 microsecond' AND sqla_jobs_job.id != all(%(skip)s::BIGINT[]) ORDER BY sqla_jobs_job.finished_at 
 LIMIT %(limit)s::BIGINT FOR UPDATE SKIP LOCKED))) AND sqla_jobs_job.state IN ('completed', 'dead', 'cancelled')
