SELECT sqla_jobs_job.id, sqla_jobs_job.state 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = any(%(states)s::TEXT[]) AND (%(queue)s::VARCHAR IS NULL OR sqla_jobs_job.queue = %(queue)s::VARCHAR) AND (%(kind)s::VARCHAR IS NULL OR sqla_jobs_job.kind = %(kind)s::VARCHAR) AND (%(max_id)s::BIGINT IS NULL OR sqla_jobs_job.id <= %(max_id)s::BIGINT) ORDER BY sqla_jobs_job.id 
 LIMIT %(limit)s::BIGINT
