DELETE FROM sqla_jobs_worker WHERE sqla_jobs_worker.expires_at < now() - %(grace)s AND NOT (EXISTS (SELECT * 
FROM sqla_jobs_job 
WHERE sqla_jobs_job.state = 'running' AND sqla_jobs_job.locked_by = sqla_jobs_worker.name)) RETURNING sqla_jobs_worker.name
