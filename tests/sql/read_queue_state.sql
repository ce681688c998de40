SELECT sqla_jobs_queue.paused_at 
FROM sqla_jobs_queue 
WHERE sqla_jobs_queue.queue = %(queue)s::VARCHAR FOR UPDATE
