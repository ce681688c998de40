SELECT sqla_jobs_job.id, sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.state, sqla_jobs_job.priority, sqla_jobs_job.attempts, sqla_jobs_job.max_attempts, sqla_jobs_job.crashes, sqla_jobs_job.interruptions, sqla_jobs_job.run_at, sqla_jobs_job.created_at, sqla_jobs_job.finished_at, sqla_jobs_job.cancel_requested_at, sqla_jobs_job.last_error, sqla_jobs_job.meta 
FROM sqla_jobs_job 
WHERE (%(states)s::TEXT[] IS NULL OR sqla_jobs_job.state = any(%(states)s::TEXT[])) AND (%(queue)s::VARCHAR IS NULL OR sqla_jobs_job.queue = %(queue)s::VARCHAR) AND (%(kind)s::VARCHAR IS NULL OR sqla_jobs_job.kind = %(kind)s::VARCHAR) AND (%(meta)s::JSONB IS NULL OR (sqla_jobs_job.meta @> %(meta)s::JSONB)) AND sqla_jobs_job.id < %(before)s::BIGINT ORDER BY sqla_jobs_job.id DESC 
 LIMIT %(limit)s::BIGINT
