DELETE FROM sqla_jobs_queue WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR RETURNING sqla_jobs_queue.paused_at
