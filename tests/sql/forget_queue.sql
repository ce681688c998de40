DELETE FROM sqla_jobs_queue WHERE sqla_jobs_queue.queue = %(name)s::VARCHAR RETURNING sqla_jobs_queue.paused_at
