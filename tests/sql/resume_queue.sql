UPDATE sqla_jobs_queue SET paused_at=NULL, updated_at=now() WHERE sqla_jobs_queue.queue = %(name)s::VARCHAR AND sqla_jobs_queue.paused_at IS NOT NULL RETURNING sqla_jobs_queue.queue
