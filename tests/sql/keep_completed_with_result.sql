WITH done AS 
(UPDATE sqla_jobs_job SET state='completed', lease_token=NULL, lease_expires_at=NULL, locked_by=NULL, last_error=left(%(error)s::VARCHAR, %(left_1)s::INTEGER), finished_at=now() WHERE sqla_jobs_job.id = %(job_id)s::BIGINT AND sqla_jobs_job.lease_token = %(token)s::UUID RETURNING sqla_jobs_job.id), 
recorded AS 
(INSERT INTO sqla_jobs_outcome (id, outcome, finished_at, result) SELECT done.id AS id, 'completed', now() AS now_1, CAST(%(result)s::VARCHAR AS JSONB) AS anon_1 
FROM done ON CONFLICT (id) DO UPDATE SET result = excluded.result RETURNING sqla_jobs_outcome.id)
 SELECT done.id 
FROM done
