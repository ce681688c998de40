SELECT sqla_jobs_outcome.result, sqla_jobs_outcome.result IS NOT NULL AS stored 
FROM sqla_jobs_outcome 
WHERE sqla_jobs_outcome.id = %(job_id)s::BIGINT
