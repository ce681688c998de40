DELETE FROM sqla_jobs_worker WHERE sqla_jobs_worker.expires_at < now() RETURNING sqla_jobs_worker.name
