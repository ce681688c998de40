WITH done AS 
(DELETE FROM sqla_jobs_job WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.lease_token = %(token)s::UUID RETURNING sqla_jobs_job.id, sqla_jobs_job.queue, sqla_jobs_job.kind, sqla_jobs_job.payload, sqla_jobs_job.attempts, sqla_jobs_job.crashes, sqla_jobs_job.created_at, sqla_jobs_job.last_error, sqla_jobs_job.errors, sqla_jobs_job.steps, sqla_jobs_job.meta), 
recorded AS 
(INSERT INTO sqla_jobs_outcome (id, outcome, finished_at, result) SELECT given.id AS id, 'completed', now() AS now_1, CAST(given.result AS JSONB) AS result 
FROM unnest(%(ids)s::BIGINT[], %(results)s::TEXT[]) AS given(id, result) 
WHERE given.id IN (SELECT done.id 
FROM done) ON CONFLICT (id) DO UPDATE SET result = excluded.result RETURNING sqla_jobs_outcome.id)
 INSERT INTO sqla_jobs_history (id, queue, kind, payload, attempts, crashes, created_at, last_error, errors, steps, meta) SELECT done.id, done.queue, done.kind, done.payload, done.attempts, done.crashes, done.created_at, done.last_error, done.errors, done.steps, done.meta 
FROM done RETURNING sqla_jobs_history.id
