DELETE FROM sqla_jobs_worker WHERE sqla_jobs_worker.name = %(name)s::VARCHAR RETURNING sqla_jobs_worker.name
