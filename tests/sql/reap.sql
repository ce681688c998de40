WITH expired AS MATERIALIZED 
(SELECT sqla_jobs_job.id AS id, sqla_jobs_job.locked_by AS locked_by 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'running' AND sqla_jobs_job.lease_expires_at < now() ORDER BY sqla_jobs_job.lease_expires_at 
 LIMIT %(limit)s::BIGINT FOR UPDATE SKIP LOCKED)
 UPDATE sqla_jobs_job SET state=CASE WHEN (sqla_jobs_job.crashes + %(crashes_1)s::INTEGER >= sqla_jobs_job.max_crashes) THEN 'dead' ELSE 'pending' END, run_at=now(), crashes=(sqla_jobs_job.crashes + %(crashes_2)s::INTEGER), lease_token=NULL, lease_expires_at=NULL, locked_by=NULL, last_error=left(%(coalesce_1)s::VARCHAR || coalesce(sqla_jobs_job.locked_by, %(coalesce_2)s::VARCHAR) || %(param_1)s::VARCHAR, %(left_1)s::INTEGER) FROM expired WHERE sqla_jobs_job.id = expired.id RETURNING sqla_jobs_job.id, sqla_jobs_job.kind, sqla_jobs_job.state, sqla_jobs_job.crashes, expired.locked_by, sqla_jobs_job.queue
