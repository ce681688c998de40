DELETE FROM sqla_jobs_outcome WHERE sqla_jobs_outcome.id = any(array((SELECT sqla_jobs_outcome.id 
FROM sqla_jobs_outcome 
WHERE sqla_jobs_outcome.finished_at < now() - %(older_than_us)s::BIGINT * interval '1 microsecond' ORDER BY sqla_jobs_outcome.finished_at 
 LIMIT %(limit)s::BIGINT FOR UPDATE SKIP LOCKED))) RETURNING sqla_jobs_outcome.id
