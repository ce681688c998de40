WITH done AS 
(DELETE FROM sqla_jobs_job WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.lease_token = %(token)s::UUID RETURNING sqla_jobs_job.id, sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.attempts, sqla_jobs_job.crashes, sqla_jobs_job.created_at)
 INSERT INTO sqla_jobs_history (id, queue, kind, payload, attempts, crashes, created_at) SELECT done.id, done.queue, done.kind, done.payload, done.attempts, done.crashes, done.created_at 
FROM done RETURNING sqla_jobs_history.id
