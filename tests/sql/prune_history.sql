DELETE FROM sqla_jobs_history WHERE sqla_jobs_history.id = any(array((SELECT sqla_jobs_history.id 
FROM sqla_jobs_history 
WHERE sqla_jobs_history.outcome = %(outcome)s::VARCHAR AND sqla_jobs_history.finished_at < now() - %(older_than_us)s::BIGINT * interval '1 microsecond' ORDER BY sqla_jobs_history.finished_at 
 LIMIT %(limit)s::BIGINT FOR UPDATE SKIP LOCKED)))
