WITH done AS 
(DELETE FROM sqla_jobs_job WHERE sqla_jobs_job.id = any(%(ids)s::BIGINT[]) AND sqla_jobs_job.lease_token = %(token)s::UUID RETURNING sqla_jobs_job.id), 
recorded AS 
(INSERT INTO sqla_jobs_outcome (id, outcome, finished_at, result) SELECT given.id AS id, 'completed', now() AS now_1, CAST(given.result AS JSONB) AS result 
FROM unnest(%(ids)s::BIGINT[], %(results)s::TEXT[]) AS given(id, result) 
WHERE given.id IN (SELECT done.id 
FROM done) ON CONFLICT (id) DO UPDATE SET result = excluded.result RETURNING sqla_jobs_outcome.id)
 SELECT done.id 
FROM done
