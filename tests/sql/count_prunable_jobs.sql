SELECT count(*) AS count_1 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state IN ('completed', 'dead', 'cancelled') AND sqla_jobs_job.state = %(state)s::VARCHAR AND sqla_jobs_job.finished_at < now() - %(older_than_us)s::BIGINT * interval '1 microsecond'
